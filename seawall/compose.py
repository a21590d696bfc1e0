"""Runs a docker-compose file's Seawall services as local processes: ``seawall up --compose FILE``.

The same services, commands and environment as ``docker compose up``, so the compose file is exercised on a
machine without Docker. What changes between a container and a local process:

    compose                                  local process
    ---------------------------------------  ----------------------------------------------------------
    ${VAR}, ${VAR:-default}, ... , $$        interpolated as compose does (environment, then ./.env)
    build: .  (a Seawall image)              the Dockerfile's ENTRYPOINT + the service's command, with
                                             `python` = this interpreter, run in the compose file's dir
    image: prom/prometheus                   the local `prometheus` binary when on PATH, else skipped
    any other image (jaeger...)              skipped, with a note; env vars naming it are dropped
    service name as a host (`scheduler`)     127.0.0.1; so is 0.0.0.0 (nothing listens beyond loopback)
    container port (ports:, expose:)         a free local port per (service, port), or with
                                             ``publish=True`` a published port's host port
    SERVICE:PORT, 0.0.0.0:PORT, --x-port N   rewritten to 127.0.0.1:LOCAL / LOCAL
    named volume / bind mount                a directory under ``state_dir/volumes`` / the host path;
                                             arguments and env values under a mount target follow it;
                                             bind-mounted files of non-Seawall services get SERVICE:PORT
                                             rewritten (prometheus.yml's scrape targets)
    depends_on conditions                    started in dependency order; service_healthy runs the
                                             service's healthcheck command locally until it passes,
                                             service_completed_successfully waits for exit code 0
    stop (Ctrl-C)                            as `docker compose down`: dependents first, those that can
                                             stop together at once, each with its stop_signal, SIGKILL
                                             after its stop_grace_period (a second Ctrl-C: at once)

So a compose file keeps working here when every port a service listens on is in its ``ports:`` or
``expose:`` and commands name other services as SERVICE:PORT. Not supported: replicas, ``extends``,
``network_mode``, port ranges; ``profiles`` are honoured through ``COMPOSE_PROFILES``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from seawall.launcher import Child, LocalMesh, MeshOptions, free_port
from services.common.credentials import API_KEY_ENV
from services.common.errors import InvalidArgument, Unavailable

LOOPBACK = "127.0.0.1"
# Images run from a local binary of the same program, when it is on PATH; the compose `command` is its args.
LOCAL_BINARIES = {"prom/prometheus": "prometheus"}
# The modules of Seawall's workers: the scheduler waits for this many registrations.
WORKER_MODULES = ("services.prefill", "services.decode", "services.worker")
CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")
_LOCAL_HOSTS = ("0.0.0.0", "127.0.0.1", "localhost")
_HOSTPORT = re.compile(r"(?<![\w.-])(?P<host>[A-Za-z0-9_][A-Za-z0-9_.-]*):(?P<port>\d{1,5})(?!\d)")
_VAR = re.compile(r"\$(?:(?P<escaped>\$)|(?P<named>[A-Za-z_][A-Za-z0-9_]*)|\{(?P<braced>[^}]*)\})")
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.DOTALL)


@dataclass(frozen=True)
class ComposeOptions:
    file: Path
    # Where relative paths (build contexts, bind mounts, .env) start; None = the file's directory. As
    # `docker compose --project-directory`.
    project_dir: Path | None = None
    # True: a published port ("8000:8000") listens on its host port, as with Docker; False: every port is a
    # free one (tests, or a second mesh beside a running one).
    publish: bool = True
    # Where named volumes live; None = $SEAWALL_CACHE_DIR/compose/<project> (kept across runs, like volumes).
    state_dir: Path | None = None
    # Where children write their logs (<service>.log); None = this process's stdout and stderr.
    log_dir: Path | None = None
    # The environment interpolated into the file and inherited by children; None = os.environ.
    environ: Mapping[str, str] | None = None
    startup_timeout_s: float = 600.0


@dataclass
class LocalService:
    """One compose service as a local process: everything already interpolated and rewritten."""

    name: str
    argv: list[str]
    # Added to the caller's environment (which children inherit, as PATH and the venv must reach them).
    env: dict[str, str]
    ports: dict[int, int]  # container port -> local port
    # Local healthcheck command; None = no healthcheck (a TCP connect to ``tcp_probe`` when that is set).
    healthcheck: list[str] | None
    tcp_probe: int | None
    health_timeout_s: float
    depends_on: dict[str, str]  # service -> condition, skipped services left out
    # Others wait for it to exit 0 (service_completed_successfully): its exit is not a failure.
    one_shot: bool = False
    # stop_signal and stop_grace_period: how it is stopped (SIGKILL once the grace period is over).
    stop_signal: int = signal.SIGTERM
    stop_grace_s: float = 10.0

    @property
    def module(self) -> str | None:
        """The ``python -m`` module this service runs, if it is a Python service."""
        return self.argv[2] if len(self.argv) > 2 and self.argv[1] == "-m" else None

    def flag(self, name: str) -> str | None:
        """The value of ``--name V`` or ``--name=V`` in the command, else None."""
        for i, arg in enumerate(self.argv):
            if arg == name and i + 1 < len(self.argv):
                return self.argv[i + 1]
            if arg.startswith(name + "="):
                return arg.partition("=")[2]
        return None


@dataclass
class ComposePlan:
    project: str
    project_dir: Path
    services: list[LocalService]  # in start order: every service after what it depends on
    skipped: list[str]
    notes: list[str] = field(default_factory=list)

    def service(self, name: str) -> LocalService:
        return next(s for s in self.services if s.name == name)


# --- interpolation -------------------------------------------------------------------------------------------

def interpolate(value: object, env: Mapping[str, str]) -> object:
    """``value`` (YAML data) with ``$VAR``, ``${VAR}``, ``${VAR:-d}``, ``${VAR-d}``, ``${VAR:?e}``, ``${VAR?e}``,
    ``${VAR:+a}``, ``${VAR+a}`` replaced in every string, and ``$$`` turned into ``$``, as compose does."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: _substitute(m, env), value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def _substitute(m: re.Match, env: Mapping[str, str]) -> str:
    if m["escaped"]:
        return "$"
    if m["named"]:
        return env.get(m["named"], "")
    b = _BRACED.fullmatch(m["braced"])
    if b is None:
        raise InvalidArgument(f"invalid interpolation {m[0]!r} in the compose file")
    name, op, arg = b["name"], b["op"], b["arg"] or ""
    value = env.get(name)
    unset_or_empty = not value if op and op.startswith(":") else value is None
    if op in (":-", "-"):
        return arg if unset_or_empty else value
    if op in (":?", "?"):
        if unset_or_empty:
            raise InvalidArgument(f"the compose file needs ${name}: {arg or 'it is not set'}")
        return value
    if op in (":+", "+"):
        return "" if unset_or_empty else arg
    return value or ""


def read_env_file(path: Path) -> dict[str, str]:
    """A ``.env`` / ``env_file`` file: ``KEY=VALUE`` lines, ``#`` comments, optional quotes; {} if missing."""
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def load(path: Path, environ: Mapping[str, str], project_dir: Path | None = None) -> tuple[dict, dict[str, str]]:
    """The compose file interpolated with ``environ`` over the project's ``.env``; and that environment."""
    env = {**read_env_file((project_dir or path.parent) / ".env"), **environ}
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict) or not doc["services"]:
        raise InvalidArgument(f"{path} has no services")
    return interpolate(doc, env), env


# --- reading one service -------------------------------------------------------------------------------------

def dockerfile_exec(path: Path) -> tuple[list[str], list[str]]:
    """The last ENTRYPOINT and CMD of a Dockerfile, in exec form (shell form becomes ``/bin/sh -c``)."""
    if not path.is_file():
        raise InvalidArgument(f"{path} does not exist (named by a service's build:)")
    entrypoint: list[str] = []
    cmd: list[str] = []
    for line in dockerfile_lines(path.read_text()):
        word, _, rest = line.partition(" ")
        if word.upper() in ("ENTRYPOINT", "CMD"):
            rest = rest.strip()
            args = json.loads(rest) if rest.startswith("[") else ["/bin/sh", "-c", rest]
            if word.upper() == "ENTRYPOINT":
                entrypoint = args
            else:
                cmd = args
    return entrypoint, cmd


def dockerfile_lines(text: str) -> list[str]:
    """A Dockerfile's instructions, one a line: continuations joined, comments dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append((current + stripped).strip())
        current = ""
    return [line for line in lines if line]


def image_repository(image: str) -> str:
    """``prom/prometheus`` of ``prom/prometheus:v2.55.1`` (or of ``...@sha256:...``)."""
    image = image.split("@")[0]
    name, _, tag = image.rpartition(":")
    return name if name and "/" not in tag else image


def _argv(value: object) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def container_ports(name: str, svc: dict) -> list[tuple[int, int | None]]:
    """``(container port, published host port or None)`` for each of ``ports:`` and ``expose:``."""
    out: list[tuple[int, int | None]] = []
    for p in svc.get("ports") or []:
        if isinstance(p, dict):
            out.append((int(p["target"]), int(p["published"]) if p.get("published") else None))
            continue
        parts = str(p).split("/")[0].split(":")
        if any("-" in part for part in parts):
            raise InvalidArgument(f"{name}: port ranges ({p}) are not supported locally")
        host = parts[-2] if len(parts) >= 2 and parts[-2] else None
        out.append((int(parts[-1]), int(host) if host else None))
    for e in svc.get("expose") or []:
        out.append((int(str(e).split("/")[0]), None))
    return out


def depends_on(name: str, svc: dict) -> dict[str, str]:
    deps = svc.get("depends_on") or {}
    if isinstance(deps, list):
        return {d: "service_started" for d in deps}
    out = {}
    for dep, spec in deps.items():
        condition = (spec or {}).get("condition", "service_started")
        if condition not in CONDITIONS:
            raise InvalidArgument(f"{name}: depends_on {dep} has unknown condition {condition!r}")
        out[dep] = condition
    return out


def environment(svc: dict, project_dir: Path) -> dict[str, str | None]:
    """``env_file:`` then ``environment:`` (list or map); None = pass the caller's value through."""
    env: dict[str, str | None] = {}
    files = svc.get("env_file") or []
    for f in [files] if isinstance(files, str) else files:
        env.update(read_env_file(project_dir / (f["path"] if isinstance(f, dict) else f)))
    e = svc.get("environment") or {}
    items = [item.partition("=") for item in e] if isinstance(e, list) else [
        (k, "=" if v is not None else "", "" if v is None else _scalar(v)) for k, v in e.items()]
    for key, eq, value in items:
        env[key] = value if eq else None
    return env


def _scalar(v: object) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _duration_s(value: object, default: float) -> float:
    if value is None:
        return default
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(us|ms|h|m|s)", str(value)):
        total += float(number) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}[unit]
    return total


# --- rewriting container names, ports and paths --------------------------------------------------------------

class _Rewriter:
    """Maps what a container sees (service hosts, container ports, mount targets) to this machine."""

    def __init__(self, ports: dict[str, dict[int, int]], skipped: set[str]) -> None:
        self.ports = ports  # running service -> container port -> local port
        self.skipped = skipped
        self.refs: set[str] = set()  # skipped services named since the last reset

    def text(self, s: str, own: str, mounts: list[tuple[str, str]]) -> str:
        for target, host in mounts:
            if s == target or s.startswith(target.rstrip("/") + "/"):
                return host + s[len(target):]
        if s == "0.0.0.0" or s in self.ports:
            return LOOPBACK
        if s in self.skipped:
            self.refs.add(s)
            return s
        return _HOSTPORT.sub(lambda m: self._host_port(m, own), s)

    def _host_port(self, m: re.Match, own: str) -> str:
        host, port = m["host"], int(m["port"])
        if host in self.skipped:
            self.refs.add(host)
            return m[0]
        target = host if host in self.ports else own if host in _LOCAL_HOSTS else None
        if target is None:
            return m[0]
        return f"{LOOPBACK}:{self._port(target, port, m[0])}"

    def _port(self, service: str, port: int, where: str) -> int:
        local = self.ports[service].get(port)
        if local is None:
            raise InvalidArgument(f"{where!r} names port {port} of {service}, which is in neither its ports: nor "
                                  "expose: (list every port a service listens on there)")
        return local

    def argv(self, args: list[str], own: str, mounts: list[tuple[str, str]]) -> list[str]:
        """Rewrites each argument; the value of a flag named ``--*port`` that is a container port of ``own``
        becomes its local port."""
        out = []
        for i, arg in enumerate(args):
            flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
            if flag and not eq:
                out.append(arg)
                continue
            prev = args[i - 1] if i else ""
            port_flag = flag if eq else prev if prev.startswith("--") and "=" not in prev else ""
            if port_flag.endswith("port") and value.isdigit() and int(value) != 0:
                value = str(self._port(own, int(value), f"{port_flag} {value}"))
            else:
                value = self.text(value, own, mounts)
            out.append(f"{flag}={value}" if eq else value)
        return out


# --- the plan ------------------------------------------------------------------------------------------------

def plan(options: ComposeOptions) -> ComposePlan:
    """What ``ComposeMesh`` will start, and how; raises InvalidArgument on what cannot run locally."""
    path = options.file.expanduser().resolve()
    if not path.is_file():
        raise InvalidArgument(f"{options.file} does not exist")
    environ = dict(os.environ if options.environ is None else options.environ)
    project_dir = (options.project_dir or path.parent).expanduser().resolve()
    doc, env = load(path, environ, project_dir)
    name = env.get("COMPOSE_PROJECT_NAME") or project_dir.name
    project = re.sub(r"[^a-z0-9_-]", "", name.lower()) or "seawall"
    cache = Path(environ.get("SEAWALL_CACHE_DIR") or Path.home() / ".cache" / "seawall").expanduser()
    state = (options.state_dir or cache / "compose" / project).absolute()
    profiles = {p for p in env.get("COMPOSE_PROFILES", "").split(",") if p}
    services = {n: s or {} for n, s in doc["services"].items()
                if not (s or {}).get("profiles") or profiles & set(s["profiles"])}
    notes: list[str] = []
    programs = _programs(services, project_dir, notes)
    skipped = [n for n in services if n not in programs]
    rewriter = _Rewriter(_local_ports(programs, services, options.publish), set(skipped))
    ctx = _Context(path, project_dir, state, doc.get("volumes") or {}, environ, services, rewriter)
    local = [_local_service(name, program, ctx) for name, program in programs.items()]
    notes += ctx.notes
    notes += [f"{key} left unset in {', '.join(names)}: it names {refs}"
              for (key, refs), names in ctx.unset.items()]
    by_name = {s.name: s for s in local}
    for s in local:
        for dep, condition in s.depends_on.items():
            if condition == "service_completed_successfully":
                by_name[dep].one_shot = True
            if condition == "service_healthy" and by_name[dep].healthcheck is None and by_name[dep].tcp_probe is None:
                raise InvalidArgument(f"{s.name} waits for {dep} to be healthy, but {dep} has no healthcheck")
    return ComposePlan(project, project_dir, _start_order(local), skipped, notes)


def _programs(services: dict[str, dict], project_dir: Path, notes: list[str]) -> dict[str, list[str]]:
    """The program (entrypoint) of each service that runs here; fills in a built service's default command."""
    programs: dict[str, list[str]] = {}
    for name, svc in services.items():
        if (svc.get("deploy") or {}).get("replicas", 1) != 1 or svc.get("scale", 1) != 1:
            raise InvalidArgument(f"{name}: replicas are not supported locally")
        if "build" in svc:
            build = svc["build"] if isinstance(svc["build"], dict) else {"context": svc["build"]}
            context = project_dir / build.get("context", ".")
            entrypoint, cmd = dockerfile_exec(context / build.get("dockerfile", "Dockerfile"))
            if "entrypoint" in svc:
                entrypoint = _argv(svc["entrypoint"])
            svc.setdefault("command", cmd)
            programs[name] = [sys.executable if i == 0 and a in ("python", "python3") else a
                              for i, a in enumerate(entrypoint)]
            continue
        program = LOCAL_BINARIES.get(image_repository(str(svc.get("image", ""))))
        binary = shutil.which(program) if program else None
        if binary:
            programs[name] = [binary]
        else:
            notes.append(f"{name} ({svc.get('image', 'no image')}) does not run here (no local binary)")
    return programs


def _local_ports(programs: dict[str, list[str]], services: dict[str, dict],
                 publish: bool) -> dict[str, dict[int, int]]:
    used: set[int] = set()
    ports: dict[str, dict[int, int]] = {}
    for name in programs:
        ports[name] = {}
        for container, published in container_ports(name, services[name]):
            if container not in ports[name]:
                local = published if publish and published else _free_port(used)
                used.add(local)
                ports[name][container] = local
    return ports


@dataclass
class _Context:
    """What planning one service needs to know about the others."""

    path: Path
    project_dir: Path
    state: Path
    volumes: dict  # the top-level volumes:
    environ: dict[str, str]
    services: dict[str, dict]
    rewriter: _Rewriter
    notes: list[str] = field(default_factory=list)
    unset: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (variable, names) -> services


def _local_service(name: str, program: list[str], ctx: _Context) -> LocalService:
    svc, rewriter = ctx.services[name], ctx.rewriter
    mounts = _mounts(name, svc, ctx.project_dir, ctx.state, ctx.volumes)
    if "build" not in svc:
        mounts = _rewritten_files(name, mounts, rewriter, ctx.state)
    argv = program + rewriter.argv(_argv(svc.get("command")), name, mounts)
    if rewriter.refs:
        ctx.notes.append(f"{name}: its command names {', '.join(sorted(rewriter.refs))}, which does not run here")
        rewriter.refs.clear()
    env: dict[str, str] = {}
    for key, value in environment(svc, ctx.project_dir).items():
        value = ctx.environ.get(key) if value is None else rewriter.text(value, name, mounts)
        if rewriter.refs:
            ctx.unset.setdefault((key, ", ".join(sorted(rewriter.refs))), []).append(name)
            rewriter.refs.clear()
        elif value is not None:
            env[key] = value
    check, timeout_s = _healthcheck(svc, name, mounts, rewriter)
    ports = rewriter.ports[name]
    if check is not None and shutil.which(check[0]) is None:
        ctx.notes.append(f"{name}: its healthcheck needs {check[0]}, which is not here; a TCP connect stands in")
        check = None
    tcp = next(iter(ports.values()), None) if check is None and "build" not in svc else None
    deps = depends_on(name, svc)
    for dep in deps:
        if dep not in ctx.services:
            raise InvalidArgument(f"{name} depends on {dep}, which is not a service of {ctx.path.name}")
    return LocalService(name, argv, env, ports, check, tcp, timeout_s,
                        {d: c for d, c in deps.items() if d in rewriter.ports},
                        stop_signal=_stop_signal(name, svc.get("stop_signal", "SIGTERM")),
                        stop_grace_s=_duration_s(svc.get("stop_grace_period"), 10.0))


def _stop_signal(name: str, value: object) -> int:
    """A compose ``stop_signal``: a name (``SIGINT``, ``INT``) or a number."""
    text = str(value).strip().upper()
    try:
        return signal.Signals(int(text)) if text.isdigit() else signal.Signals["SIG" + text.removeprefix("SIG")]
    except (KeyError, ValueError):
        raise InvalidArgument(f"{name}: stop_signal {value!r} is not a signal (e.g. SIGTERM, SIGINT, 15)") from None


def _free_port(used: set[int]) -> int:
    while True:
        port = free_port(LOOPBACK)
        if port not in used:
            return port


def _mounts(name: str, svc: dict, project_dir: Path, state: Path, volumes: dict) -> list[tuple[str, str]]:
    """``(container target, local path)`` per volume, longest target first (the most specific wins)."""
    out = []
    for v in svc.get("volumes") or []:
        if isinstance(v, dict):
            source, target = v.get("source"), v["target"]
        else:
            parts = str(v).split(":")
            source, target = (parts[0], parts[1]) if len(parts) >= 2 else (None, parts[0])
        if not source:
            local = state / "anonymous" / name / target.strip("/").replace("/", "_")
        elif source.startswith((".", "/", "~")):
            local = (project_dir / Path(source).expanduser()).resolve()
        else:
            if source not in volumes:
                raise InvalidArgument(f"{name}: volume {source!r} is not declared under the top-level volumes:")
            local = state / "volumes" / source
        if not source or not source.startswith((".", "/", "~")):
            local.mkdir(parents=True, exist_ok=True)
        out.append((target, str(local)))
    return sorted(out, key=lambda m: -len(m[0]))


def _rewritten_files(name: str, mounts: list[tuple[str, str]], rewriter: _Rewriter,
                     state: Path) -> list[tuple[str, str]]:
    """Bind-mounted files of a non-Seawall service, with SERVICE:PORT rewritten, as copies under ``state``."""
    out = []
    for target, local in mounts:
        if Path(local).is_file():
            copy = state / "files" / name / Path(local).name
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(_HOSTPORT.sub(lambda m: rewriter._host_port(m, name), Path(local).read_text()))
            rewriter.refs.clear()  # a scrape target of a service that does not run here just stays down
            local = str(copy)
        out.append((target, local))
    return out


def _healthcheck(svc: dict, name: str, mounts: list[tuple[str, str]],
                 rewriter: _Rewriter) -> tuple[list[str] | None, float]:
    hc = svc.get("healthcheck") or {}
    timeout_s = _duration_s(hc.get("timeout"), 30.0) or 30.0
    test = hc.get("test")
    if hc.get("disable") or not test or test == ["NONE"]:
        return None, timeout_s
    if isinstance(test, str):
        argv = ["/bin/sh", "-c", rewriter.text(test, name, mounts)]
    elif test[0] == "CMD-SHELL":
        argv = ["/bin/sh", "-c", rewriter.text(test[1], name, mounts)]
    elif test[0] == "CMD":
        argv = rewriter.argv(test[1:], name, mounts)
    else:
        raise InvalidArgument(f"{name}: healthcheck test must start with CMD, CMD-SHELL or NONE, got {test[0]!r}")
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv, timeout_s


def _start_order(services: list[LocalService]) -> list[LocalService]:
    """Every service after its dependencies, otherwise in file order."""
    done: list[LocalService] = []
    names: set[str] = set()
    pending = list(services)
    while pending:
        ready = next((s for s in pending if set(s.depends_on) <= names), None)
        if ready is None:
            raise InvalidArgument(f"depends_on has a cycle among {', '.join(s.name for s in pending)}")
        pending.remove(ready)
        done.append(ready)
        names.add(ready.name)
    return done


# --- running it ----------------------------------------------------------------------------------------------

class ComposeMesh(LocalMesh):
    """The compose file's runnable services as children of this process (``LocalMesh``'s stop and logs).

    ``start`` starts each service once its ``depends_on`` conditions hold, then waits until every service with
    a healthcheck passes it and, when a service runs ``services.scheduler``, until every worker service has
    registered with it. ``grpc_address``/``http_url``/``metrics_urls`` are then the local endpoints.
    """

    def __init__(self, options: ComposeOptions) -> None:
        super().__init__(MeshOptions(log_dir=options.log_dir, startup_timeout_s=options.startup_timeout_s))
        self.compose = options
        self.plan: ComposePlan | None = None
        self.metrics_urls: dict[str, str] = {}
        self._healthy_names: set[str] = set()

    def _launch(self) -> None:
        self.plan = plan(self.compose)
        deadline = time.monotonic() + self.compose.startup_timeout_s
        pending = list(self.plan.services)
        while pending or not all(self._holds(s, "service_healthy") for s in self.plan.services if not s.one_shot):
            if time.monotonic() > deadline:
                waiting = pending or [s for s in self.plan.services if s.name not in self._healthy_names]
                raise Unavailable(f"timed out after {self.compose.startup_timeout_s:.0f} s waiting for "
                                  f"{', '.join(s.name for s in waiting)}{self._log_hint()}")
            self._check_children()
            for svc in list(pending):  # like compose: each service as soon as its conditions hold
                if all(self._holds(self.plan.service(d), c) for d, c in svc.depends_on.items()):
                    self._spawn_service(svc)
                    pending.remove(svc)
            time.sleep(0.3)
        self._find_endpoints()
        workers = [s for s in self.plan.services if s.module in WORKER_MODULES]
        if self.grpc_address and workers:
            self._wait(lambda stats: len(stats.workers) >= len(workers), f"{len(workers)} workers to register")

    def _find_endpoints(self) -> None:
        for svc in self.plan.services:
            if svc.module == "services.scheduler":
                # Waiting for the workers asks the scheduler, which wants its key if it has one.
                environ = os.environ if self.compose.environ is None else self.compose.environ
                key = {**environ, **svc.env}.get(API_KEY_ENV)  # what _spawn_service gave it
                self.options = replace(self.options, api_key=key or None)
                grpc_port, http_port = svc.flag("--grpc-port"), svc.flag("--http-port")
                self.grpc_address = f"{LOOPBACK}:{grpc_port}" if grpc_port else ""
                if http_port and http_port != "0":
                    self.http_url = f"http://{LOOPBACK}:{http_port}"
                    self.metrics_urls[svc.name] = f"{self.http_url}/metrics"
            metrics_port = svc.flag("--metrics-port")
            if metrics_port and metrics_port != "0":
                self.metrics_urls[svc.name] = f"http://{LOOPBACK}:{metrics_port}/metrics"

    def _spawn_service(self, svc: LocalService) -> None:
        out = None
        log_path = None
        if self.options.log_dir is not None:
            self.options.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.options.log_dir / f"{svc.name}.log"
            out = log_path.open("wb")
        environ = os.environ if self.compose.environ is None else self.compose.environ
        proc = subprocess.Popen(svc.argv, env={**environ, **svc.env}, cwd=self.plan.project_dir, stdout=out,
                                stderr=subprocess.STDOUT if out else None, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        if out is not None:
            out.close()
        self.children.append(Child(svc.name, proc, log_path, stop_signal=svc.stop_signal,
                                   stop_grace_s=svc.stop_grace_s))

    def _stop_groups(self) -> list[list[Child]]:
        """As ``docker compose down``: each service once every service that depends on it has stopped, those
        that can stop together at once (a draining worker's grace period is not spent one worker at a time)."""
        left = list(self.children)
        groups = []
        while left:
            needed = {d for c in left for d in self.plan.service(c.name).depends_on}
            group = [c for c in left if c.name not in needed] or left  # cannot be empty: depends_on has no cycle
            groups.append(group)
            left = [c for c in left if c not in group]
        return groups

    def _holds(self, svc: LocalService, condition: str) -> bool:
        """Whether ``condition`` holds for ``svc`` now (a started service's healthcheck runs once per call)."""
        child = next((c for c in self.children if c.name == svc.name), None)
        if child is None:
            return False
        if condition == "service_started":
            return True
        if condition == "service_completed_successfully":
            code = child.proc.poll()
            if code not in (None, 0):
                raise Unavailable(f"{svc.name} exited with code {code}{self._log_hint(child)}")
            return code == 0
        if svc.name not in self._healthy_names and child.proc.poll() is None and self._healthy(svc):
            self._healthy_names.add(svc.name)
        return svc.name in self._healthy_names

    def _healthy(self, svc: LocalService) -> bool:
        if svc.healthcheck is not None:
            try:
                return subprocess.run(svc.healthcheck, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, timeout=svc.health_timeout_s).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                return False
        if svc.tcp_probe is not None:
            with socket.socket() as s:
                s.settimeout(1.0)
                return s.connect_ex((LOOPBACK, svc.tcp_probe)) == 0
        return True

    def _check_children(self) -> None:
        self._check_stopping()
        one_shot = {s.name for s in self.plan.services if s.one_shot} if self.plan else set()
        for child in self.children:
            code = child.proc.poll()
            if code is not None and not (code == 0 and child.name in one_shot):
                raise Unavailable(f"{child.name} exited with code {code} during start-up{self._log_hint(child)}")
