"""Helpers shared by the compose tests: parse a compose service's command with its module's own parser."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
CUDA_OVERRIDE = REPO / "deploy" / "docker-compose.cuda.yml"
# Flags the compose file uses that are being added to the services in parallel (issue 6, metrics). Until a
# module accepts one, the command checks drop it (and say so) instead of failing; then it is checked like any.
PENDING_FLAGS = ("--metrics-port",)


def parse_command(argv: list[str]) -> object:
    """What ``python -m argv[0] argv[1:]`` would parse its flags into; AssertionError with argparse's message."""
    module, args = argv[0], list(argv[1:])
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            if module == "services.scheduler":
                from services.scheduler.main import parse_args

                return parse_args(args)
            if module in ("services.prefill", "services.decode"):
                from services.worker.main import parse_args

                return parse_args(args, module.removeprefix("services."))
            if module == "services.kvcache":
                from services.kvcache.main import parse_args

                return parse_args(args)
            if module == "seawall":
                from seawall.cli import build_parser

                return build_parser().parse_args(args)
    except SystemExit as exc:
        raise AssertionError(f"python -m {' '.join(argv)}: {err.getvalue().strip()}") from exc
    raise AssertionError(f"no parser known for module {module!r}: add it to tests/deploy/commands.py")


def unsupported_pending_flags(argv: list[str]) -> list[str]:
    """The PENDING_FLAGS in ``argv`` that its module does not accept yet."""
    missing = []
    for flag in PENDING_FLAGS:
        if flag in argv:
            try:
                parse_command([argv[0], flag, argv[argv.index(flag) + 1]])
            except AssertionError:
                missing.append(flag)
    return missing


def strip_flags(argv: list[str], flags: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        else:
            out.append(arg)
    return out


def parse_accepted(argv: list[str]) -> object:
    """``parse_command`` of ``argv`` less the pending flags its module does not have yet."""
    return parse_command(strip_flags(argv, unsupported_pending_flags(argv)))


def runnable_compose_file(tmp_path: Path) -> Path:
    """docker-compose.yml, or a copy of it without the pending flags the services do not accept yet (beside
    copies of the files it names by relative path, so it runs from ``tmp_path`` as from the repository)."""
    doc = yaml.safe_load(COMPOSE_FILE.read_text())
    changed = False
    for svc in doc["services"].values():
        command = svc.get("command")
        if "build" in svc and command and command[0].startswith("services."):
            missing = unsupported_pending_flags(command)
            if missing:
                svc["command"] = strip_flags(command, missing)
                changed = True
    if not changed:
        return COMPOSE_FILE
    tmp_path.mkdir(parents=True, exist_ok=True)
    copy = tmp_path / "docker-compose.yml"
    copy.write_text(yaml.safe_dump(doc, sort_keys=False))
    for name in ("Dockerfile", "deploy/prometheus.yml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, tmp_path / name)
    return copy


def require(condition: bool, reason: str) -> None:
    if not condition:
        pytest.skip(reason)
