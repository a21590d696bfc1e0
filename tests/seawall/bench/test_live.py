"""``seawall bench --spawn`` end to end on the built-in model: meshes as real processes, JSON and HTML out."""

from __future__ import annotations

import json
import re

import pytest

from seawall.bench.arrivals import ArrivalSpec
from seawall.bench.hf_baseline import run_hf
from seawall.bench.workload import WorkloadSpec, build
from seawall.cli import main

pytestmark = pytest.mark.slow


def test_spawn_two_policies_writes_json_and_html(tmp_path, capsys):
    out, html = tmp_path / "bench.json", tmp_path / "bench.html"
    # 400 tokens each keep the steady users decoding past the burst at 0.4 s on a fast box too (at ~2 ms a step,
    # 200 were done by then, and the burst's 2 x 200 tokens take 7 chunked steps).
    code = main(["bench", "--spawn", "--policies", "vllm,sarathi", "--workload", "burst", "--steady-users", "3",
                 "--steady-output-len", "400", "--burst-at", "0.4", "--steady-ramp-s", "0.1", "--burst-size", "2",
                 "--burst-prompt-len", "200", "--burst-output-len", "4", "--chunk-size", "64", "--warmup", "1",
                 "--slo-ttft", "5", "--slo-tbt", "1", "--json", str(out), "--html", str(html), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "ratio to vllm" in printed and "target sarathi_burst_tbt_p99_vs_steady" in printed
    assert "queue p99 ms" in printed  # the server's queueing delay
    report = json.loads(out.read_text())
    assert list(report["results"]) == ["vllm", "sarathi"]
    for res in report["results"].values():
        assert res["num_finished"] == res["num_requests"] == 5
        assert res["output_tokens"] == 3 * 400 + 2 * 4
        assert res["num_decoding_at_burst"] >= 1
        assert res["kv_blocks_peak"] > 0 and res["preemptions"] == 0
        assert res["ttft_p50"] > 0 and res["tbt_p99"] > 0 and res["goodput"] > 0
        # the control run (no burst, same mesh) was read at the burst's own tokens
        assert res["control_gaps"] > 0 and res["burst_tbt_ratio_control"] > 0
    assert report["paired"]["sarathi"]["worst_e2e_ratio"] > 0
    assert report["workload"]["bursts"] == [0.4]
    assert html.read_text().count("<svg") == 3


def test_http_api_with_a_concurrency_cap(tmp_path):
    out = tmp_path / "bench.json"
    code = main(["bench", "--spawn", "--api", "http", "--num-requests", "6", "--arrival", "burst",
                 "--prompt-len", "32", "--output-len", "6", "--max-concurrency", "2", "--warmup", "0",
                 "--shared-prefix-len", "64", "--json", str(out), "--no-progress"])
    assert code == 0
    report = json.loads(out.read_text())
    (name, res), = report["results"].items()
    assert name == "sarathi"  # the policy the mesh reports
    assert res["num_finished"] == 6 and res["output_tokens"] == 36
    assert res["kv_blocks_total"] > 0  # stats come over gRPC beside the HTTP load
    assert res["queue_delay_p50"] >= 0  # from the stream's x-queue-time header
    sent = sorted(r["sent"] for r in report["requests"]["sarathi"])
    assert sent[2] > sent[1]  # the third waited for a slot
    # One 64-token system prompt (4 blocks) in front of every prompt: the requests that waited for a slot
    # took it from the prefix cache, which GetStats counts.
    assert {r["prompt_len"] for r in report["requests"]["sarathi"]} == {96}
    assert res["prefix_hit_blocks"] >= 4 * 4 and 0 < res["prefix_hit_rate"] < 1


def test_hf_baseline_runs_the_same_requests(tiny_model_dir):
    wl = build(WorkloadSpec(arrivals=ArrivalSpec("poisson", rate=50.0), num_requests=4, prompt_len=24,
                            output_len=5))
    from transformers import PreTrainedModel

    modes = (True, False) if hasattr(PreTrainedModel, "generate_batch") else (False,)
    for use_cb in modes:
        records, api = run_hf(str(tiny_model_dir), wl, progress=False, use_cb=use_cb)
        assert [r.num_tokens for r in records] == [5] * 4, api
        assert all(r.ttft > 0 and len(r.gaps()) == 4 for r in records), api


def test_a_priority_mix_is_sent_and_reported_per_class(tmp_path, capsys):
    out = tmp_path / "bench.json"
    # One sequence at a time and every request arriving at once: after the first, the queue is served by
    # priority: the urgent fifth waits for at most the first request and each other, the rest for ~half the run.
    # Seed 3 makes requests 3, 9, 15 and 19 urgent: in arrival order the last of them would start last.
    code = main(["bench", "--spawn", "--num-requests", "20", "--seed", "3", "--arrival", "burst", "--prompt-len", "16",
                 "--output-len", "32", "--max-num-seqs", "1", "--priority-mix=-1:0.2", "--warmup", "1",
                 "--json", str(out), "--no-progress"])
    assert code == 0
    assert "by priority (lower runs sooner):" in capsys.readouterr().out
    report = json.loads(out.read_text())
    res = report["results"]["sarathi"]
    assert sorted(r["priority"] for r in report["requests"]["sarathi"]) == [-1] * 4 + [0] * 16
    urgent, normal = res["by_priority"]["-1"], res["by_priority"]["0"]
    assert (urgent["num_finished"], normal["num_finished"]) == (4, 16)
    assert urgent["ttft_p99"] < normal["ttft_p50"]


def test_a_terminated_benchmark_stops_the_mesh_it_started(tmp_path):
    import signal
    import socket
    import subprocess
    import sys
    import time

    logs = tmp_path / "mesh"
    proc = subprocess.Popen([sys.executable, "-m", "seawall", "bench", "--spawn", "--num-requests", "400",
                             "--rate", "2", "--prompt-len", "8", "--output-len", "4", "--warmup", "0",
                             "--mesh-log-dir", str(logs), "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port = None
        deadline = time.monotonic() + 120
        while port is None and time.monotonic() < deadline:  # the scheduler is up: the run is under way
            log = logs / "sarathi" / "scheduler.log"  # one directory per policy
            text = log.read_text() if log.exists() else ""
            found = re.search(r"scheduler gRPC on [\d.]+:(\d+)", text)
            port = int(found.group(1)) if found and "joined" in text else None
            time.sleep(0.2)
        assert port is not None, "the mesh never came up"
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        with pytest.raises(OSError):  # the scheduler was stopped with the benchmark, not left running
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        proc.kill()


def test_repeats_alternate_the_policies_and_judge_the_targets_on_every_round(tmp_path, capsys):
    out, logs = tmp_path / "bench.json", tmp_path / "mesh"
    code = main(["bench", "--spawn", "--policies", "fcfs,fastserve", "--repeats", "2", "--num-requests", "6",
                 "--arrival", "burst", "--lengths", "pareto", "--prompt-len", "16", "--max-output-len", "24",
                 "--max-num-seqs", "2", "--warmup", "1", "--json", str(out), "--mesh-log-dir", str(logs),
                 "--no-progress"])
    assert code == 0
    captured = capsys.readouterr()
    started = re.findall(r"--policy (\w+) \(round (\d) of 2\)", captured.err)
    assert started == [("fcfs", "1"), ("fastserve", "1"), ("fastserve", "2"), ("fcfs", "2")]
    assert sorted(p.name for p in logs.iterdir()) == ["fastserve", "fastserve-2", "fcfs", "fcfs-2"]
    report = json.loads(out.read_text())
    assert report["repeats"] == 2 and [r["round"] for r in report["rounds"]] == [1, 2]
    for r in report["rounds"]:
        assert list(r["results"]) == ["fcfs", "fastserve"]  # the given order, whichever ran first
        assert all(res["num_finished"] == 6 for res in r["results"].values())
    gain = report["targets"]["fastserve_mean_latency_2x_fcfs"]
    per_round = [r["results"]["fcfs"]["e2e_mean"] / r["results"]["fastserve"]["e2e_mean"] for r in report["rounds"]]
    assert [g["gain"] for g in gain["rounds"]] == pytest.approx(per_round)
    assert gain["gain"] == pytest.approx(sum(per_round) / 2)  # the median of two
    assert gain["met"] == (gain["gain"] >= 2.0)
    assert "target fastserve_mean_latency_2x_fcfs (median of 2 rounds)" in captured.out
    assert "gain by round:" in captured.out


def test_requests_run_the_lora_adapters_they_name(tmp_path, lora_dirs):
    out = tmp_path / "bench.json"
    # "gamma" is no adapter of the spawned mesh: its requests are refused (404), so only "alpha"'s finish.
    code = main(["bench", "--spawn", "--num-requests", "8", "--arrival", "burst", "--prompt-len", "16",
                 "--output-len", "4", "--warmup", "0", "--lora-modules", f"alpha={lora_dirs['alpha']}",
                 "--loras", "alpha,gamma", "--json", str(out), "--no-progress"])
    assert code == 0
    res = json.loads(out.read_text())["results"]["sarathi"]
    wl = build(WorkloadSpec(arrivals=ArrivalSpec("burst"), num_requests=8, prompt_len=16, output_len=4,
                            lora_names=("alpha", "gamma")))
    assert 0 < res["num_finished"] == sum(r.model == "alpha" for r in wl.requests) < 8
