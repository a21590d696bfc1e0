"""``seawall model``: create the built-in random-weight Llama checkpoint (offline), locate the default one, and
check whether a checkpoint directory is served (and as what) before loading it.

seawall model init DIR [--preset tiny|small] [--seed N] [--shards N] [--force]
seawall model path
seawall model check DIR [--max-model-len N] [--json]
seawall model architectures
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from services.common.errors import InvalidArgument
from services.engine import builtin_model


def _init(args: argparse.Namespace) -> int:
    out = args.dir.expanduser().absolute()
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise InvalidArgument(f"{out} already exists and is not empty; pass --force to replace it")
    try:
        path = builtin_model.init_model(
            out, preset=args.preset, seed=args.seed, num_shards=args.shards, overwrite=args.force
        )
    except OSError as exc:  # a parent that is a file, or a place this user cannot write
        raise InvalidArgument(f"cannot write the model to {out}: {exc}") from exc
    sys.stdout.write(f"{path}\n")
    return 0


def _path(args: argparse.Namespace) -> int:
    sys.stdout.write(f"{builtin_model.ensure_default_model()}\n")
    return 0


def _check(args: argparse.Namespace) -> int:
    from services.engine.checkpoint_report import render, report

    if not args.dir.is_dir():
        raise InvalidArgument(f"{args.dir} is not a directory; pass a Hugging Face checkpoint directory")
    facts = report(args.dir, args.max_model_len)
    sys.stdout.write(json.dumps(facts, indent=2) + "\n" if args.json else render(facts))
    return 0 if facts["served"] else 1


def _architectures(args: argparse.Namespace) -> int:
    from services.engine.aliases import ALIASES
    from services.engine.model_config import SUPPORTED_ARCHITECTURES
    from services.engine.vision_language import VISION_LANGUAGE

    rows = [(arch, "") for arch in SUPPORTED_ARCHITECTURES]
    rows += [(arch, f"served as {alias.target}") for arch, alias in ALIASES.items()]
    # (None: the language model's architecture is the one its text_config names)
    rows += [(arch, f"its language model, as {text or 'its text_config names'}") for arch, text in VISION_LANGUAGE.items()]
    width = max(len(arch) for arch, _ in rows)
    sys.stdout.write("".join(f"{arch:<{width}}  {how}".rstrip() + "\n" for arch, how in sorted(rows)))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``model init``, ``path``, ``check`` and ``architectures`` to the ``seawall`` parser."""
    model = subparsers.add_parser("model", help="create or locate the built-in model", description=__doc__)
    model_sub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")

    init = model_sub.add_parser(
        "init",
        help="write a random-weight Llama checkpoint (Hugging Face format) with the built-in tokenizer",
        description="Write a random-weight Llama checkpoint in Hugging Face format with the built-in tokenizer. "
        "Nothing is downloaded; the same preset and seed always give byte-identical files.",
    )
    init.add_argument(
        "dir", type=Path, metavar="DIR", help="output directory (missing or empty unless --force)"
    )
    init.add_argument(
        "--preset", default="tiny", choices=sorted(builtin_model.PRESETS), help="model size (default: tiny)"
    )
    init.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    init.add_argument("--shards", type=int, default=1, help="number of safetensors files (default: 1)")
    init.add_argument("--force", action="store_true", help="replace DIR if it already holds a model")
    init.set_defaults(func=_init)

    path = model_sub.add_parser(
        "path",
        help="print the built-in default model's directory, creating it if missing",
        description="Print the directory of the built-in default model ($SEAWALL_CACHE_DIR/models/...), "
        "creating it first if it does not exist.",
    )
    path.set_defaults(func=_path)

    check = model_sub.add_parser(
        "check",
        help="say whether a checkpoint directory is served, as what, and what it takes (no weights loaded)",
        description="Read a checkpoint's config.json, safetensors headers and tokenizer files (no weights, no "
        "torch) and print whether Seawall serves it and as which architecture, its shape, attention and "
        "positions, the KV cache a token takes, its parameters, tokenizer and output; or why it is refused "
        "(exit status 1).",
    )
    check.add_argument("dir", type=Path, metavar="DIR", help="the checkpoint directory")
    check.add_argument("--max-model-len", type=int, default=None,
                       help="the context to serve (default: the model's), which picks some RoPE variants")
    check.add_argument("--json", action="store_true", help="print the facts as JSON")
    check.set_defaults(func=_check)

    archs = model_sub.add_parser(
        "architectures", help="list the architectures (config.json's architectures[0]) Seawall serves",
        description="List every architecture name Seawall serves: its own, those served as another one "
        "(transformers builds them from its parts), and vision-language ones served as their language model.")
    archs.set_defaults(func=_architectures)
