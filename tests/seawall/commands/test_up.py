"""``seawall up`` starts the whole mesh as processes on the built-in model, serves, and stops cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from seawall import Client
from seawall.launcher import free_port
from services.common.errors import InvalidArgument

pytestmark = pytest.mark.slow


def _wait_for_line(proc: subprocess.Popen, text: str, timeout_s: float) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"{text!r} not printed; got {lines!r} (exit {proc.poll()})")


@pytest.mark.timeout(400)
def test_up_starts_the_mesh_on_the_builtin_model_serves_and_stops_cleanly(tmp_path):
    grpc_port, http_port = free_port(), free_port()
    env = {**os.environ, "SEAWALL_CACHE_DIR": str(tmp_path / "cache"), "SEAWALL_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "seawall", "up", "--grpc-port", str(grpc_port), "--http-port",
                             str(http_port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        lines = _wait_for_line(proc, "press Ctrl-C to stop", 300)
        text = "".join(lines)
        assert "mesh ready (disaggregated; kvcache, prefill-0, decode-1" in text
        assert f"127.0.0.1:{grpc_port}" in text and f"http://127.0.0.1:{http_port}/v1" in text
        assert f"seawall stats --address 127.0.0.1:{grpc_port} --watch 1" in text
        assert (tmp_path / "cache" / "models").is_dir()
        with Client(f"127.0.0.1:{grpc_port}") as client:
            out = client.generate("Burst traffic is", max_tokens=5, temperature=0)
        assert len(out.token_ids) == 5 and out.finish_reason == "length"
        models = httpx.get(f"http://127.0.0.1:{http_port}/v1/models").json()
        assert models["data"][0]["id"].startswith("builtin-tiny")
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, rest
    assert "stopped (decode-1=0, prefill-0=0, scheduler=0, kvcache=0)" in rest
    assert " failed (" not in rest  # workers that stop on purpose, holding nothing, are not failures
    assert "Traceback" not in rest


def test_up_with_a_missing_model_says_so(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "seawall", "up", "--model", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_up_with_a_bad_scheduling_flag_says_so_before_starting_anything():
    proc = subprocess.run([sys.executable, "-m", "seawall", "up", "--decode-steps", "0"], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert "--decode-steps must be >= 1" in proc.stderr and "Traceback" not in proc.stderr
    assert "mesh" not in proc.stdout  # nothing was started


def test_up_with_a_negative_torch_thread_count_says_so():
    proc = subprocess.run([sys.executable, "-m", "seawall", "up", "--torch-threads", "-2"], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert "--torch-threads: expected a whole number >= 0" in proc.stderr and "Traceback" not in proc.stderr


def test_up_and_bench_pass_no_cpu_kernels_to_the_workers():
    from seawall.cli import build_parser
    from seawall.commands import bench, up

    parser = build_parser()
    assert "--no-cpu-kernels" not in up.options_from(parser.parse_args(["up"])).worker_args
    assert "--no-cpu-kernels" in up.options_from(parser.parse_args(["up", "--no-cpu-kernels"])).worker_args
    args = parser.parse_args(["bench", "--spawn", "--no-cpu-kernels"])
    assert "--no-cpu-kernels" in bench.mesh_options(args, "sarathi").worker_args
    assert "--no-cpu-kernels" in bench.mesh_flags(args)



def test_up_bench_and_run_batch_take_a_kv_cache_dtype_and_refuse_an_unknown_one(capsys):
    from seawall.cli import build_parser
    from seawall.commands import bench, up

    parser = build_parser()
    workers = up.options_from(parser.parse_args(["up", "--kv-cache-dtype", "fp8"])).worker_args
    assert workers[workers.index("--kv-cache-dtype") + 1] == "fp8"
    args = parser.parse_args(["bench", "--spawn", "--kv-cache-dtype", "fp8_e5m2"])
    workers = bench.mesh_options(args, "sarathi").worker_args
    assert workers[workers.index("--kv-cache-dtype") + 1] == "fp8_e5m2"
    assert "--kv-cache-dtype fp8_e5m2" in bench.mesh_flags(args)
    assert parser.parse_args(["run-batch", "-i", "in", "-o", "out", "--kv-cache-dtype", "fp8"]).kv_cache_dtype == "fp8"
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--kv-cache-dtype", "int8"])
    assert "invalid choice: 'int8'" in capsys.readouterr().err

def test_up_passes_max_model_len_to_the_scheduler_and_every_worker_and_refuses_one_the_model_lacks():
    from seawall.cli import build_parser
    from seawall.commands import up

    parser = build_parser()
    options = up.options_from(parser.parse_args(["up", "--max-model-len", "256"]))
    for flags in (options.scheduler_args, options.worker_args):
        assert flags[flags.index("--max-model-len") + 1] == "256"
    assert "--max-model-len" not in up.options_from(parser.parse_args(["up"])).worker_args
    with pytest.raises(InvalidArgument, match="max_model_len 100000 must be between 1 and the model's"):
        up.options_from(parser.parse_args(["up", "--max-model-len", "100000"]))


def test_up_and_bench_pass_the_step_thread_to_the_workers_when_one_is_chosen():
    from seawall.cli import build_parser
    from seawall.commands import bench, up

    parser = build_parser()
    assert "--step-thread" not in up.options_from(parser.parse_args(["up"])).worker_args  # auto: the worker decides
    worker_args = up.options_from(parser.parse_args(["up", "--step-thread", "own"])).worker_args
    assert worker_args[worker_args.index("--step-thread") + 1] == "own"
    args = parser.parse_args(["bench", "--spawn", "--step-thread", "loop"])
    assert bench.mesh_options(args, "sarathi").worker_args[-2:] == ["--step-thread", "loop"]
    assert "--step-thread loop" in bench.mesh_flags(args)


def test_up_passes_the_tool_call_and_reasoning_parsers_to_the_scheduler():
    from seawall.cli import build_parser
    from seawall.commands import up

    parser = build_parser()
    plain = up.options_from(parser.parse_args(["up"])).scheduler_args
    assert "--tool-call-parser" not in plain and "--reasoning-parser" not in plain
    sched = up.options_from(parser.parse_args(["up", "--tool-call-parser", "hermes", "--reasoning-parser",
                                               "qwen3"])).scheduler_args
    assert sched[sched.index("--tool-call-parser") + 1] == "hermes"
    assert sched[sched.index("--reasoning-parser") + 1] == "qwen3"
    assert "--structured-output-in-reasoning" not in sched
    inside = up.options_from(parser.parse_args(["up", "--reasoning-parser", "qwen3",
                                                "--structured-output-in-reasoning"])).scheduler_args
    assert "--structured-output-in-reasoning" in inside
    with pytest.raises(InvalidArgument, match="needs --reasoning-parser"):
        up.options_from(parser.parse_args(["up", "--structured-output-in-reasoning"]))


def test_up_checks_lora_adapters_before_starting_anything_and_passes_them_on(tiny_model_dir, lora_dirs, tmp_path):
    from seawall.cli import build_parser
    from seawall.commands import up

    parser = build_parser()
    sched = up.options_from(parser.parse_args(["up", "--model", str(tiny_model_dir), "--lora-modules",
                                               f"alpha={lora_dirs['alpha']}", "--allow-runtime-lora-updating"]
                                              )).scheduler_args
    assert sched[sched.index("--lora-modules") + 1] == f"alpha={lora_dirs['alpha']}"
    assert "--allow-runtime-lora-updating" in sched
    with pytest.raises(InvalidArgument, match=r"LoRA 'alpha'.*rank 8 is above --max-lora-rank 4"):
        up.options_from(parser.parse_args(["up", "--model", str(tiny_model_dir), "--lora-modules",
                                           f"alpha={lora_dirs['alpha']}", "--max-lora-rank", "4"]))
    with pytest.raises(InvalidArgument, match="cannot read adapter_config.json"):
        up.options_from(parser.parse_args(["up", "--lora-modules", f"x={tmp_path}"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--lora-modules", "no-equals-sign"])


def test_up_passes_the_idle_lora_cache_size_to_every_worker():
    from seawall.cli import build_parser
    from seawall.commands import up
    from services.worker.main import parse_args

    worker_args = up.options_from(build_parser().parse_args(["up", "--max-cpu-loras", "2"])).worker_args
    assert worker_args[worker_args.index("--max-cpu-loras") + 1] == "2"
    assert parse_args(["--max-cpu-loras", "2"], "decode").engine.max_idle_loras == 2
    with pytest.raises(InvalidArgument, match="max_idle_loras must be >= 0"):
        parse_args(["--max-cpu-loras", "-1"], "decode")


def test_up_makes_room_on_every_worker_for_the_states_of_a_full_step():
    from seawall.cli import build_parser
    from seawall.commands import up
    from services.worker.main import parse_args

    worker_args = up.options_from(build_parser().parse_args(["up", "--max-num-seqs", "64"])).worker_args
    assert worker_args[worker_args.index("--state-slots") + 1] == "64"
    assert parse_args(["--state-slots", "64"], "decode").engine.state_slots == 64
    with pytest.raises(InvalidArgument, match="state_slots must be >= 1"):
        parse_args(["--state-slots", "0"], "decode")


def test_up_passes_each_worker_the_states_it_keeps_for_prefix_caching():
    from seawall.cli import build_parser
    from seawall.commands import up
    from services.worker.main import parse_args

    argv = ["up", "--state-checkpoints", "32", "--host-state-checkpoints", "128"]
    worker_args = up.options_from(build_parser().parse_args(argv)).worker_args
    assert worker_args[worker_args.index("--state-checkpoints") + 1] == "32"
    assert worker_args[worker_args.index("--host-state-checkpoints") + 1] == "128"
    assert parse_args(["--state-checkpoints", "0"], "decode").engine.state_checkpoints == 0
    assert parse_args([], "decode").engine.host_state_checkpoints == 64
    with pytest.raises(InvalidArgument, match="state_checkpoints must be >= 0"):
        parse_args(["--state-checkpoints", "-1"], "decode")
    with pytest.raises(InvalidArgument, match="host_state_checkpoints must be >= 0"):
        parse_args(["--host-state-checkpoints", "-1"], "decode")


def test_up_passes_kvcache_the_room_it_keeps_for_states_stored_with_blocks():
    from seawall.cli import build_parser
    from seawall.commands import up
    from services.kvcache.main import parse_args

    kvcache_args = up.options_from(build_parser().parse_args(["up", "--kvcache-state-bytes", "0"])).kvcache_args
    assert kvcache_args[kvcache_args.index("--state-bytes") + 1] == "0"
    assert "--state-bytes" not in up.options_from(build_parser().parse_args(["up"])).kvcache_args
    assert parse_args(["--state-bytes", "0"]).state_bytes == 0 and parse_args([]).state_bytes == 1 << 30
    assert parse_args([]).state_disk_bytes == 4 << 30  # used with a disk tier (--kvcache-disk-dir)
    for flag in ("--state-bytes", "--state-disk-bytes"):
        with pytest.raises(SystemExit) as exc:
            parse_args([flag, "-1"])
        assert exc.value.code == 2
