"""Chat templates render as transformers' ``apply_chat_template`` renders them (services/scheduler/
chat_template.py): the same text for templates that use what transformers gives them, read from where
transformers reads them."""

from __future__ import annotations

import json
import shutil

import jinja2
import pytest
from tokenizers import Tokenizer

from services.common.errors import InvalidArgument
from services.scheduler.chat_prompt import ChatPrompt
from services.scheduler.chat_template import (
    checked_template,
    load_template,
    sorted_keys,
    sorts_tools,
    special_tokens,
    template_messages,
    template_source,
)
from tests.bos_tokenizer import add_bos_to_every_text

transformers = pytest.importorskip("transformers")

# Each feature transformers gives templates, used as templates in the wild use it.
TEMPLATE = (
    "{{ bos_token }}{% if strftime_now is defined %}Today: {{ strftime_now('%d %b %Y') }}\n{% endif %}"
    "{% if tools %}Tools: {{ tools | tojson }}\nIndented: {{ tools[0] | tojson(indent=2) }}\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role not in ['system', 'user', 'assistant', 'tool'] %}{{ raise_exception('bad role ' + m.role) }}"
    "{% endif %}"
    "{% if loop.index > 5 %}{% break %}{% endif %}"
    "<{{ m.role }}>{% if m.thinking is defined %}[{{ m.thinking }}]{% endif %}"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}"
    "{% endif %}{{ pad_token }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Temperature in <°C> & wind",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": "Sunny.", "reasoning_content": "Look it up."},
            {"role": "user", "content": "Tomorrow?"}]


@pytest.fixture
def checkpoint(tmp_path, tiny_model_dir):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    return tmp_path


def _theirs(path, messages, **kwargs):
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def _ours(path, messages, tools=None, add_generation_prompt=False):
    return load_template(path).render(**special_tokens(path), messages=template_messages(messages),
                                      add_generation_prompt=add_generation_prompt, **({"tools": tools} if tools else {}))


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_templates_render_as_transformers_renders_them(checkpoint, where):
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    if where == "chat_template.jinja":  # it wins over tokenizer_config.json's, as in transformers
        (checkpoint / "chat_template.jinja").write_text(TEMPLATE)
        config["chat_template"] = "{{ 'not this one' }}"
    else:
        config["chat_template"] = TEMPLATE
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config))
    for messages, kwargs in ((MESSAGES, {"tools": TOOLS, "add_generation_prompt": True}), (MESSAGES * 2, {})):
        want = _theirs(checkpoint, messages, **kwargs)
        assert _ours(checkpoint, messages, **kwargs) == want
    assert '"Temperature in <°C> & wind"' in want or '"Temperature in <°C> & wind"' in _ours(
        checkpoint, MESSAGES, TOOLS)  # neither HTML-escaped nor ASCII-escaped
    assert "[Look it up.]" in want  # reasoning_content reaches a template that reads "thinking"
    with pytest.raises(jinja2.TemplateError, match="bad role critic"):
        _ours(checkpoint, [{"role": "critic", "content": "x"}])


def test_no_template_anywhere_is_none_and_named_templates_take_the_default(checkpoint):
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_template(checkpoint) is None
    config["chat_template"] = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_template(checkpoint).render(messages=[]) == "plain"


def test_kimi_k2s_tokenizer_sorts_the_tools_keys_at_every_depth_and_others_keep_them(checkpoint):
    """Kimi K2's tokenizer class sorts the tools before its template renders them (its deep_sort_dict), so the
    model saw them sorted in training; other tokenizers pass them as sent."""
    assert not sorts_tools(checkpoint)
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config))
    assert sorts_tools(checkpoint)
    tool = {"type": "function", "function": {"parameters": {"required": ["b", "a"], "properties": {"b": {}, "a": {}}},
                                             "name": "f"}}
    assert json.dumps(sorted_keys([tool])) == json.dumps([{"function": {"name": "f", "parameters": {
        "properties": {"a": {}, "b": {}}, "required": ["b", "a"]}}, "type": "function"}])  # lists keep their order


def test_a_chat_prompt_has_the_one_bos_its_template_writes_as_transformers_tokenizes_it(checkpoint):
    # A tokenizer adding a BOS of its own to the rendered text made it two (Llama 3, Gemma, Mistral).
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    bos = add_bos_to_every_text(checkpoint)
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    chat = ChatPrompt(checkpoint, lambda text, special: tokenizer.encode(text, add_special_tokens=special).ids)
    theirs = transformers.AutoTokenizer.from_pretrained(checkpoint).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert chat.render({"messages": MESSAGES}) == theirs and theirs.count(bos) == 1
    # vLLM's add_special_tokens asks for the tokenizer's too.
    assert chat.render({"messages": MESSAGES, "add_special_tokens": True}) == [bos, *theirs]
    with pytest.raises(InvalidArgument, match="add_special_tokens must be true or false"):
        chat.render({"messages": MESSAGES, "add_special_tokens": "no"})


def test_a_server_template_is_a_file_or_the_template_itself(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0].content }}\n")
    assert template_source(str(path)) == "{{ messages[0].content }}\n"
    # Written on a command line: its escapes are read, its other characters kept.
    assert template_source("«{{ messages[0].content }}»\\n中") == "«{{ messages[0].content }}»\n中"
    with pytest.raises(ValueError, match="looks like a file's path, but it cannot be read"):
        template_source(str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="--chat-template does not compile"):
        checked_template("{% for m in %}")


def test_the_server_template_replaces_the_checkpoints_and_a_request_brings_its_own_only_if_trusted(checkpoint):
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))

    def encode(text, special):
        return tokenizer.encode(text, add_special_tokens=special).ids

    messages = [{"role": "user", "content": "Hi"}]
    served = ChatPrompt(checkpoint, encode, "Q: {{ messages[0].content }}")
    assert served.render({"messages": messages}) == encode("Q: Hi", False)
    with pytest.raises(InvalidArgument, match="needs a server started with --trust-request-chat-template"):
        served.render({"messages": messages, "chat_template": "R: {{ messages[0].content }}"})
    trusting = ChatPrompt(checkpoint, encode, trust_request_templates=True)
    assert trusting.render({"messages": messages, "chat_template": "R: {{ messages[0].content }}"}) == encode(
        "R: Hi", False)
    for bad, message in (("{% if %}", "chat_template does not compile"), (7, "must be a Jinja template")):
        with pytest.raises(InvalidArgument, match=message):
            trusting.render({"messages": messages, "chat_template": bad})


def test_documents_reach_the_template_as_transformers_passes_them(checkpoint):
    rag = ("{% for d in documents %}[{{ loop.index }}] {{ d.title }}: {{ d.text }}\n{% endfor %}"
           "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": rag}))
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    chat = ChatPrompt(checkpoint, lambda text, special: tokenizer.encode(text, add_special_tokens=special).ids)
    docs = [{"title": "Bursts", "text": "They come in waves."}, {"title": "Queues", "text": "They grow."}]
    messages = [{"role": "user", "content": "Why?"}]
    theirs = transformers.AutoTokenizer.from_pretrained(checkpoint).apply_chat_template(
        messages, documents=docs, tokenize=True, return_dict=False)
    assert chat.render({"messages": messages, "documents": docs}) == theirs
    with pytest.raises(InvalidArgument, match="documents must be a list of objects of strings"):
        chat.render({"messages": messages, "documents": [{"title": 1}]})
