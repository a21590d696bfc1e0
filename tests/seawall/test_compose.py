"""``seawall up --compose``: a docker-compose file's Seawall services as local processes (seawall/compose.py).

Fast tests plan small compose files (interpolation, name/port/path rewriting, start order, what cannot run);
the slow one runs docker-compose.yml itself through ``seawall up --compose``, serves a completion and stops.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from seawall import Client
from seawall.compose import ComposeMesh, ComposeOptions, image_repository, interpolate, plan, read_env_file
from seawall.launcher import free_port
from services.common.errors import InvalidArgument
from tests.deploy.commands import COMPOSE_FILE, runnable_compose_file

# --- interpolation -------------------------------------------------------------------------------------------

ENV = {"SET": "v", "EMPTY": ""}


@pytest.mark.parametrize(("text", "expected"), [
    ("$SET/${SET}", "v/v"),
    ("${UNSET:-d} ${EMPTY:-d} ${SET:-d}", "d d v"),
    ("${UNSET-d} [${EMPTY-d}]", "d []"),
    ("${SET:+alt} [${EMPTY:+alt}] ${EMPTY+alt}", "alt [] alt"),
    ("$$SET costs $$5", "$SET costs $5"),
    ("${UNSET}|$UNSET", "|"),
    ("scheduler:50051", "scheduler:50051"),
])
def test_interpolation_follows_compose(text, expected):
    assert interpolate({"a": [text]}, ENV) == {"a": [expected]}


def test_a_required_variable_that_is_missing_says_which():
    with pytest.raises(InvalidArgument, match=r"\$NEEDED: set it"):
        interpolate("${NEEDED:?set it}", ENV)
    with pytest.raises(InvalidArgument, match=r"\$EMPTY"):
        interpolate("${EMPTY:?}", ENV)
    assert interpolate("${EMPTY?}", ENV) == ""


def test_env_files_and_image_names(tmp_path):
    (tmp_path / ".env").write_text("# comment\nA=1\nexport B='two words'\nC=\"x=y\"\n\nbroken\n")
    assert read_env_file(tmp_path / ".env") == {"A": "1", "B": "two words", "C": "x=y"}
    assert read_env_file(tmp_path / "missing") == {}
    assert image_repository("prom/prometheus:v2.55.1") == "prom/prometheus"
    assert image_repository("localhost:5000/prom/prometheus") == "localhost:5000/prom/prometheus"
    assert image_repository("jaegertracing/all-in-one@sha256:abc") == "jaegertracing/all-in-one"


# --- planning ------------------------------------------------------------------------------------------------

DOCKERFILE = 'FROM python:3.11-slim\nENTRYPOINT ["python", \\\n  "-m"]\nCMD ["services.scheduler"]\n'
COMPOSE = """
x-env: &env
  CACHE: /data/cache
  ENDPOINT: ${ENDPOINT:-http://collector:4317}
services:
  init:
    build: .
    command: ["seawall", "model", "path"]
    environment: *env
    volumes: ["state:/data"]
  server:
    build: {context: ., dockerfile: Dockerfile}
    environment:
      <<: *env
      PASSED:
      LEVEL: ${LEVEL:-INFO}
    ports: ["${PORT:-8000}:8000", "50051"]
    volumes: ["state:/data", "./conf:/etc/app:ro"]
    healthcheck:
      test: ["CMD", "python", "-m", "seawall.healthcheck", "127.0.0.1:50051"]
      timeout: 2s
    depends_on:
      init: {condition: service_completed_successfully}
      collector: {condition: service_started}
  worker:
    build: .
    command: "services.prefill --host 0.0.0.0 --port=7000 --advertise worker --scheduler server:50051
              --config /etc/app/x.json --metrics-port 0 --out /data/out"
    expose: [7000]
    volumes: ["state:/data", "./conf:/etc/app"]
    depends_on: [server]
  collector:
    image: otel/opentelemetry-collector:0.100.0
    expose: ["4317"]
volumes:
  state:
"""


def _project(tmp_path: Path, compose: str = COMPOSE) -> Path:
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    (tmp_path / "conf").mkdir(exist_ok=True)
    path = tmp_path / "docker-compose.yml"
    path.write_text(compose)
    return path


def test_plan_maps_names_ports_paths_and_order(tmp_path):
    path = _project(tmp_path)
    state = tmp_path / "state"
    p = plan(ComposeOptions(path, publish=False, state_dir=state, environ={"PASSED": "yes", "PORT": "9999"}))
    assert [s.name for s in p.services] == ["init", "server", "worker"]
    assert p.skipped == ["collector"]
    init, server, worker = p.services
    assert init.one_shot and not server.one_shot
    assert init.argv == [sys.executable, "-m", "seawall", "model", "path"]
    assert server.argv == [sys.executable, "-m", "services.scheduler"]  # the Dockerfile's CMD
    data = str(state / "volumes" / "state")
    assert (state / "volumes" / "state").is_dir()
    assert server.env == {"CACHE": f"{data}/cache", "PASSED": "yes", "LEVEL": "INFO"}  # ENDPOINT: dropped
    assert any("ENDPOINT left unset in init, server: it names collector" in n for n in p.notes)
    assert set(server.ports) == {8000, 50051} and len(set(server.ports.values()) | set(worker.ports.values())) == 3
    assert 9999 not in server.ports.values()  # publish=False: every port a free one
    grpc = server.ports[50051]
    assert server.healthcheck == [sys.executable, "-m", "seawall.healthcheck", f"127.0.0.1:{grpc}"]
    assert server.health_timeout_s == 2.0
    assert server.depends_on == {"init": "service_completed_successfully"}  # the collector does not run here
    assert worker.depends_on == {"server": "service_started"}
    assert worker.argv[2:] == [
        "services.prefill", "--host", "127.0.0.1", f"--port={worker.ports[7000]}", "--advertise", "127.0.0.1",
        "--scheduler", f"127.0.0.1:{grpc}", "--config", f"{tmp_path / 'conf'}/x.json", "--metrics-port", "0",
        "--out", f"{data}/out"]
    assert worker.module == "services.prefill" and worker.flag("--port") == str(worker.ports[7000])


def test_published_ports_keep_their_host_port_by_default(tmp_path):
    p = plan(ComposeOptions(_project(tmp_path), state_dir=tmp_path / "s", environ={"PORT": "9999"}))
    assert p.service("server").ports[8000] == 9999
    assert p.service("server").ports[50051] != 50051  # published on a port Docker would pick


@pytest.mark.parametrize(("change", "message"), [
    (("--port=7000", "--port=7001"), "names port 7001 of worker, which is in neither"),
    (("server:50051", "server:50052"), "names port 50052 of server"),
    (("depends_on: [server]", "depends_on: [nope]"), "worker depends on nope, which is not a service"),
    (("collector: {condition: service_started}", "worker: {condition: service_healthy}"),
     "server waits for worker to be healthy, but worker has no healthcheck"),
    (('volumes: ["state:/data", "./conf:/etc/app"]', 'volumes: ["other:/data"]'), "volume 'other' is not declared"),
    (("expose: [7000]", "expose: [7000]\n    deploy: {replicas: 2}"), "replicas are not supported"),
    (("init: {condition: service_completed_successfully}", "worker: {condition: service_started}"),
     "depends_on has a cycle"),
])
def test_what_cannot_run_locally_is_refused_with_a_reason(tmp_path, change, message):
    assert change[0] in COMPOSE
    path = _project(tmp_path, COMPOSE.replace(*change))
    with pytest.raises(InvalidArgument, match=message):
        plan(ComposeOptions(path, publish=False, state_dir=tmp_path / "s", environ={}))


def test_the_repository_compose_file_plans_every_seawall_service(tmp_path):
    p = plan(ComposeOptions(COMPOSE_FILE, publish=False, state_dir=tmp_path, environ={}))
    assert [s.name for s in p.services][0] == "model-init"
    assert {s.name for s in p.services} >= {"model-init", "scheduler", "prefill", "decode", "kvcache"}
    assert "jaeger" in p.skipped
    scheduler = p.service("scheduler")
    grpc = scheduler.flag("--grpc-port")
    for name in ("prefill", "decode"):
        worker = p.service(name)
        assert worker.flag("--scheduler") == f"127.0.0.1:{grpc}" and worker.flag("--advertise") == "127.0.0.1"
        assert worker.env["SEAWALL_CACHE_DIR"] == str(tmp_path / "volumes" / "seawall-cache")
    ports = [port for s in p.services for port in s.ports.values()]
    assert len(ports) == len(set(ports))  # two workers' container port 50061 -> two local ports


# --- stopping ------------------------------------------------------------------------------------------------

SERVICE = """\
import signal, sys, time
from pathlib import Path

name, on_stop = sys.argv[1].removeprefix("the-"), sys.argv[2]  # the name alone would be read as a host

def stopping(sig, _):
    with open("stops.log", "a") as log:
        log.write(f"{name} {signal.Signals(sig).name} {time.time()}\\n")
    if on_stop == "exit":
        sys.exit(0)

for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, stopping)
Path(f"{name}.ready").touch()
while True:
    time.sleep(0.05)
"""


def _stopping_project(tmp_path: Path, slow_grace: str) -> Path:
    """base; fast and slow depend on it. fast exits on its SIGINT; slow ignores its signal (killed at its grace)."""
    (tmp_path / "service.py").write_text(SERVICE)
    (tmp_path / "Dockerfile").write_text('FROM python:3.11-slim\nENTRYPOINT ["python", "service.py"]\n')
    ready = "healthcheck: {{test: [CMD, test, -e, {}/{}.ready], interval: 1s}}"
    (tmp_path / "docker-compose.yml").write_text(f"""
services:
  base:
    build: .
    command: [the-base, exit]
    stop_grace_period: 1m
    {ready.format(tmp_path, "base")}
  fast:
    build: .
    command: [the-fast, exit]
    stop_signal: SIGINT
    depends_on: {{base: {{condition: service_healthy}}}}
    {ready.format(tmp_path, "fast")}
  slow:
    build: .
    command: [the-slow, hold]
    stop_grace_period: {slow_grace}
    depends_on: {{base: {{condition: service_healthy}}}}
    {ready.format(tmp_path, "slow")}
""")
    return tmp_path / "docker-compose.yml"


def _stops(project: Path) -> dict[str, tuple[str, float]]:
    lines = (project / "stops.log").read_text().split("\n")
    return {name: (sig, float(t)) for name, sig, t in (line.split() for line in lines if line)}


@pytest.mark.timeout(120)
def test_stop_goes_as_compose_down_dependents_together_each_with_its_signal_and_grace(tmp_path):
    compose = _stopping_project(tmp_path, slow_grace="1500ms")
    mesh = ComposeMesh(ComposeOptions(compose, state_dir=tmp_path / "state", environ=dict(os.environ)))
    mesh.start()
    codes = mesh.stop(grace_s=60)
    assert codes == {"fast": 0, "slow": -signal.SIGKILL, "base": 0}
    stops = _stops(tmp_path)
    assert stops["fast"][0] == "SIGINT" and stops["slow"][0] == stops["base"][0] == "SIGTERM"
    assert abs(stops["fast"][1] - stops["slow"][1]) < 1.0  # together, not one after the other
    assert stops["base"][1] - stops["slow"][1] >= 1.4  # base only once slow is gone: killed at its grace


@pytest.mark.timeout(120)
def test_a_forced_stop_kills_what_is_still_within_its_grace_period(tmp_path):
    compose = _stopping_project(tmp_path, slow_grace="10m")
    mesh = ComposeMesh(ComposeOptions(compose, state_dir=tmp_path / "state", environ=dict(os.environ)))
    mesh.start()
    threading.Timer(1.0, mesh.forced.set).start()  # the second Ctrl-C
    codes = mesh.stop()
    assert codes == {"fast": 0, "slow": -signal.SIGKILL, "base": -signal.SIGKILL}
    assert set(_stops(tmp_path)) == {"fast", "slow"}  # base: killed without waiting for its signal's handler


@pytest.mark.timeout(120)
def test_up_stops_on_ctrl_c_and_a_second_ctrl_c_stops_without_waiting(tmp_path):
    compose = _stopping_project(tmp_path, slow_grace="10m")
    env = {**os.environ, "SEAWALL_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "seawall", "up", "--compose", str(compose)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _read_until(proc, "press Ctrl-C to stop", 60)
        os.killpg(proc.pid, signal.SIGINT)
        _read_until(proc, "Ctrl-C again to kill at once", 30)
        log = tmp_path / "stops.log"
        while "slow" not in (log.read_text() if log.exists() else ""):  # slow holds on (10 min grace)
            time.sleep(0.1)
        assert proc.poll() is None
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and "stopped (" in rest, rest
    codes = dict(item.split("=") for item in rest.split("stopped (")[1].split(")")[0].split(", "))
    assert codes["slow"] == codes["base"] == "-9" and "fast" in codes  # base: not even signalled first


@pytest.mark.timeout(120)
def test_ctrl_c_during_start_up_stops_what_started(tmp_path):
    compose = _stopping_project(tmp_path, slow_grace="1s")
    compose.write_text(compose.read_text().replace("base.ready]", "never.ready]"))  # base never gets healthy
    env = {**os.environ, "SEAWALL_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "seawall", "up", "--compose", str(compose)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        while not (tmp_path / "base.ready").exists():
            assert proc.poll() is None
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "Traceback" not in out, out
    assert set(_stops(tmp_path)) == {"base"}  # stopped with its signal; what depends on it never started


def test_a_stop_signal_that_is_not_one_is_refused(tmp_path):
    compose = _stopping_project(tmp_path, slow_grace="1s")
    compose.write_text(compose.read_text().replace("SIGINT", "SIGNOPE"))
    with pytest.raises(InvalidArgument, match="fast: stop_signal 'SIGNOPE' is not a signal"):
        plan(ComposeOptions(compose, state_dir=tmp_path / "state", environ={}))


def test_up_with_a_missing_compose_file_says_so(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "seawall", "up", "--compose", str(tmp_path / "nope.yml")],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert "nope.yml does not exist" in proc.stderr and "Traceback" not in proc.stderr


# --- the real thing ------------------------------------------------------------------------------------------

def _read_until(proc: subprocess.Popen, text: str, timeout_s: float) -> str:
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        if text in line:
            return "".join(lines)
    raise AssertionError(f"{text!r} not printed; got {''.join(lines)!r} (exit {proc.poll()})")


def _prometheus_targets(port: int, jobs: set[str], timeout_s: float = 40.0) -> dict[str, str]:
    """Scrape health by job once every job in ``jobs`` has been scraped successfully (or the time is up)."""
    health: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        data = httpx.get(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in data}
        if all(health.get(job) == "up" for job in jobs):
            break
        time.sleep(1)
    return health


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_up_compose_runs_docker_compose_yml_serves_a_completion_and_stops_cleanly(tmp_path):
    compose = runnable_compose_file(tmp_path / "project")
    http_port, grpc_port, prom_port = free_port(), free_port(), free_port()
    env = {**os.environ, "SEAWALL_CACHE_DIR": str(tmp_path / "cache"), "SEAWALL_LOG_LEVEL": "WARNING",
           "SEAWALL_HTTP_PORT": str(http_port), "SEAWALL_GRPC_PORT": str(grpc_port),
           "PROMETHEUS_PORT": str(prom_port), "SEAWALL_TORCH_THREADS": "1",
           "SEAWALL_KVCACHE_DRAM_BYTES": str(64 * 2**20), "SEAWALL_KVCACHE_DISK_BYTES": str(64 * 2**20)}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen([sys.executable, "-m", "seawall", "up", "--compose", str(compose)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        text = _read_until(proc, "press Ctrl-C to stop", 300)
        ready = next(line for line in text.splitlines() if "mesh ready from" in line)
        assert all(name in ready for name in ("scheduler", "prefill", "decode", "kvcache"))
        assert "jaeger (jaegertracing/all-in-one" in text  # skipped, with a note
        assert f"127.0.0.1:{grpc_port}" in text and f"http://127.0.0.1:{http_port}/v1" in text
        state = tmp_path / "cache" / "compose" / compose.parent.name / "volumes"
        assert (state / "seawall-cache" / "models").is_dir()  # model-init wrote the built-in model there
        body = {"prompt": "The quick brown fox", "max_tokens": 6, "temperature": 0}
        reply = httpx.post(f"http://127.0.0.1:{http_port}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 6
        assert reply.json()["model"].startswith("builtin-tiny")
        with Client(f"127.0.0.1:{grpc_port}") as client:
            assert len(client.generate("Burst traffic is", max_tokens=4, temperature=0).token_ids) == 4
        if shutil.which("prometheus"):  # Debian's prometheus package: the compose file's scrape config, live
            health = _prometheus_targets(prom_port, {"seawall-scheduler", "seawall-prefill", "seawall-decode"})
            assert {health.get(j) for j in ("seawall-scheduler", "seawall-prefill", "seawall-decode")} == {"up"}
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, rest
    assert "stopped (" in rest and "Traceback" not in rest
    codes = dict(item.split("=") for item in rest.split("stopped (")[1].split(")")[0].split(", "))
    assert set(codes.values()) == {"0"} and {"scheduler", "prefill", "decode", "kvcache", "model-init"} <= set(codes)
