"""Train the byte-level BPE tokenizer of Seawall's built-in model, offline and deterministically.

Corpus origin and license
-------------------------
``services/engine/builtin/corpus.txt`` holds the docstrings (module, class and function docstrings, read
with ``ast`` so nothing is imported or executed) of the pure-Python modules of CPython's standard library,
followed by "The Zen of Python" (``import this``). That text is Copyright (c) 2001-2023 Python Software
Foundation and is distributed under the PSF License Agreement (Python Software Foundation License
Version 2, https://docs.python.org/3/license.html), which permits use, copying and redistribution provided
the copyright notice is kept; the first line of the corpus carries it.

The corpus is committed, so training never depends on which Python a machine runs. It was assembled once
with ``--build-corpus`` (CPython 3.11.7, see the corpus header); rebuilding it on another Python version
gives a different corpus and therefore a different tokenizer, which would need a new built-in model version.

Usage::

    python scripts/train_tokenizer.py                 # corpus.txt -> tokenizer.json
    python scripts/train_tokenizer.py --check         # exit 1 if tokenizer.json is not what training gives
    python scripts/train_tokenizer.py --build-corpus  # stdlib docstrings -> corpus.txt, then train

Tokenizer contract (what ``services/engine/builtin_model.py`` and its tests rely on):

- byte-level BPE: ByteLevel pre-tokenizer (no prefix space, GPT-2 regex), ByteLevel decoder, ByteLevel
  post-processor with ``trim_offsets``; no normalizer, so ``decode(encode(s)) == s`` for every string;
- 4096 ids in total; the 6 special tokens take ids 0..5 in the order of ``SPECIAL_TOKENS``;
- no template post-processor: encoding plain text never adds ``<|begin_of_text|>``. The chat template adds it.
"""

from __future__ import annotations

import argparse
import ast
import codecs
import platform
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

REPO = Path(__file__).resolve().parents[1]
BUILTIN_DIR = REPO / "services" / "engine" / "builtin"
CORPUS_PATH = BUILTIN_DIR / "corpus.txt"
TOKENIZER_PATH = BUILTIN_DIR / "tokenizer.json"

VOCAB_SIZE = 4096
SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|pad|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
CORPUS_MAX_BYTES = 1_450_000

# Top-level stdlib entries left out of the corpus: tests, GUIs, data tables and vendored code.
_SKIP_TOP = {
    "test", "idlelib", "lib2to3", "tkinter", "turtledemo", "site-packages", "dist-packages",
    "ensurepip", "pydoc_data", "encodings", "__pycache__", "__phello__", "antigravity.py", "this.py",
}  # fmt: skip


def _docstrings(tree: ast.AST) -> Iterator[str]:
    """Docstrings of a module and its classes and functions, depth first in source order."""
    if isinstance(tree, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        doc = ast.get_docstring(tree, clean=True)
        if doc:
            yield doc
    for child in ast.iter_child_nodes(tree):
        yield from _docstrings(child)


def _zen_of_python(stdlib: Path) -> str:
    """The text ``import this`` prints, decoded from ``this.py`` without importing it (that would print)."""
    tree = ast.parse((stdlib / "this.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["s"]:
            return codecs.decode(ast.literal_eval(node.value), "rot13")
    raise SystemExit("this.py no longer defines `s`; cannot extract the Zen of Python")


def build_corpus() -> str:
    """Assemble the corpus from the running interpreter's standard library (deterministic per version)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    header = (
        f"# Docstrings of the CPython {platform.python_version()} standard library and The Zen of Python. "
        "Copyright (c) 2001-2023 Python Software Foundation; PSF License Version 2.\n\n"
    )
    zen = _zen_of_python(stdlib).strip() + "\n"
    budget = CORPUS_MAX_BYTES - len(header.encode()) - len(zen.encode()) - 2
    seen: set[str] = set()
    parts: list[str] = []
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if (
            rel.parts[0] in _SKIP_TOP
            or rel.parts[0].startswith("config-")
            or {"test", "tests"} & set(rel.parts)
        ):
            continue
        for doc in _docstrings(ast.parse(path.read_text(encoding="utf-8"))):
            size = len(doc.encode()) + 2
            if doc in seen or size > budget:
                continue
            seen.add(doc)
            parts.append(doc)
            budget -= size
    return header + "\n\n".join(parts) + "\n\n" + zen


def train(corpus: str) -> Tokenizer:
    """Train the tokenizer on ``corpus``; same corpus, same ``tokenizers`` version -> same JSON."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # One document per paragraph keeps the trainer input independent of line-ending quirks.
    tokenizer.train_from_iterator(corpus.split("\n\n"), trainer=trainer)
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        raise SystemExit(f"trained {tokenizer.get_vocab_size()} tokens, want {VOCAB_SIZE}: corpus too small?")
    for want_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != want_id:
            raise SystemExit(f"special token {token} got id {tokenizer.token_to_id(token)}, want {want_id}")
    return tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--build-corpus", action="store_true", help="rebuild corpus.txt from this Python's stdlib"
    )
    mode.add_argument(
        "--check", action="store_true", help="verify tokenizer.json matches a fresh training run"
    )
    args = parser.parse_args(argv)

    if args.build_corpus:
        CORPUS_PATH.write_text(build_corpus(), encoding="utf-8", newline="\n")
    corpus = CORPUS_PATH.read_text(encoding="utf-8")
    text = train(corpus).to_str(pretty=True) + "\n"
    if args.check:
        if TOKENIZER_PATH.read_text(encoding="utf-8") != text:
            sys.stderr.write(f"{TOKENIZER_PATH} is stale: run scripts/train_tokenizer.py\n")
            return 1
        return 0
    TOKENIZER_PATH.write_text(text, encoding="utf-8", newline="\n")
    sys.stdout.write(
        f"wrote {TOKENIZER_PATH} ({VOCAB_SIZE} tokens) from {len(corpus.encode())} corpus bytes\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
