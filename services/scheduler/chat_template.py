"""A checkpoint's chat template, compiled and fed as transformers' ``apply_chat_template`` does, so that a chat
request's prompt is the one the model was trained on (tests/scheduler/test_chat_template.py renders with both).

Where the template lives: ``chat_template.jinja`` beside the tokenizer (what transformers >= 4.43 saves, and
gpt-oss ships), else ``tokenizer_config.json``'s ``chat_template`` (a string, or named templates: the default).

What it may use, as transformers gives it: ``tojson`` without HTML escaping (jinja's own writes ``<`` as
``\\u003c``, which would change every tool description with a ``<`` in it) and with ``indent`` or
``separators``; ``raise_exception(message)``; ``strftime_now(format)`` (Llama 3.x dates its prompts);
``{% break %}`` and ``{% continue %}``; ``{% generation %}`` blocks (they mark the assistant's tokens for
training and render their body); every special token of the tokenizer config (``bos_token``, ...); and each
message's reasoning under both ``reasoning_content`` and ``thinking`` (gpt-oss's template reads the latter).
A tokenizer class may feed the template its own way: Kimi K2's sorts the keys of the tools, at every depth,
before rendering (``sorts_tools``, ``sorted_keys``).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

from services.engine.tiktoken_vocab import auto_tokenizer_class

# The names a message's reasoning may come under; templates read the first, gpt-oss's reads "thinking".
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Tokenizer classes (tokenizer_config.json's auto_map) whose apply_chat_template sorts the tools' keys.
_SORTS_TOOLS = ("tokenization_kimi.TikTokenTokenizer",)


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: its body, rendered in place."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_template(source: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    return env.from_string(source)


def load_template(checkpoint_dir: Path) -> jinja2.Template | None:
    """The checkpoint's chat template, compiled; None when it has none."""
    jinja_file = checkpoint_dir / "chat_template.jinja"
    source: Any = jinja_file.read_text() if jinja_file.exists() else tokenizer_config(checkpoint_dir).get(
        "chat_template")
    if isinstance(source, list):  # several named templates: take the default one
        source = next((t["template"] for t in source if t.get("name") == "default"), None)
    return compile_template(source) if source else None


def template_source(value: str) -> str:
    """vLLM's ``--chat-template``: a file's path (its text), or the template itself (with its ``\\n`` escapes
    read as newlines, as a shell passes them); a value that looks like a path but names no file is refused."""
    try:
        return Path(value).read_text()
    except (OSError, ValueError) as exc:  # ValueError: a NUL in it
        if not any(c in value for c in "{}\n"):
            raise ValueError(f"--chat-template {value!r} looks like a file's path, but it cannot be read "
                             f"({exc})") from None
    # Characters past latin-1 go through as escapes, so that only the escapes written in the value are read.
    return value.encode("latin-1", "backslashreplace").decode("unicode_escape")


def checked_template(value: str) -> str:
    """``--chat-template``'s text (``template_source``), refused at start when it does not compile."""
    source = template_source(value)
    check_compiles(source)
    return source


def check_compiles(source: str) -> None:
    """Raises ValueError unless ``source`` is a template ``compile_template`` takes."""
    try:
        compile_template(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"--chat-template does not compile: {exc}") from None


def tokenizer_config(checkpoint_dir: Path) -> dict[str, Any]:
    path = checkpoint_dir / "tokenizer_config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def special_tokens(checkpoint_dir: Path) -> dict[str, str]:
    """Each ``*_token`` of the tokenizer config as the template sees it (bos_token, eos_token, pad_token, ...);
    bos and eos always, empty when the config has none."""
    out = {"bos_token": "", "eos_token": ""}
    for key, value in tokenizer_config(checkpoint_dir).items():
        if key.endswith("_token") and isinstance(value, (str, dict)):
            out[key] = value.get("content", "") if isinstance(value, dict) else value
    return out


def sorts_tools(checkpoint_dir: Path) -> bool:
    """Whether the checkpoint's tokenizer sorts the tools' keys before rendering them (Kimi K2's does)."""
    return auto_tokenizer_class(tokenizer_config(checkpoint_dir)) in _SORTS_TOOLS


def sorted_keys(value: Any) -> Any:
    """``value`` with every object's keys in sorted order, at every depth."""
    if isinstance(value, dict):
        return {key: sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sorted_keys(item) for item in value]
    return value


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with each one's reasoning under every name templates read it by."""
    out = []
    for m in messages:
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        out.append(m if reasoning is None else {"thinking": reasoning, **m, "reasoning_content": reasoning})
    return out
