"""``seawall sim`` on the command line: run, capacity, reproduce (one row), calibration, list."""

from __future__ import annotations

import json

import pytest

from seawall.cli import main

RUN_KEYS = {"ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "e2e_p50", "e2e_p99", "throughput_tok_s",
            "max_concurrent_seqs", "preemptions", "kv_waste_frac", "queueing_frac"}


def test_run_writes_the_metrics_json(tmp_path, capsys):
    out = tmp_path / "run.json"
    rc = main(["sim", "run", "--model", "Llama-2-7B", "--gpu", "A100-40GB", "--policy", "vllm",
               "--workload", "sharegpt", "--qps", "2", "--num-requests", "40", "--seed", "3",
               "--max-total-len", "4096", "--per-request", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert RUN_KEYS <= data.keys()
    assert data["num_finished"] == 40 and len(data["requests"]) == 40
    assert data["policy"] == "vllm" and data["workload"]["seed"] == 3
    assert "tbt_p99" in capsys.readouterr().out


def test_a_float8_kv_cache_is_a_flag_of_run_and_dualpath(tmp_path, capsys):
    """The simulated pool of a burst in fp8 (one byte a KV element) holds twice the blocks of the 16-bit one."""
    blocks = {}
    for dtype in ("auto", "fp8"):
        out = tmp_path / f"{dtype}.json"
        assert main(["sim", "run", "--model", "Llama-2-7B", "--gpu", "A100-40GB", "--workload", "fixed",
                     "--arrival", "burst", "--num-requests", "8", "--kv-cache-dtype", dtype, "--json", str(out)]) == 0
        blocks[dtype] = json.loads(out.read_text())["num_gpu_blocks"]
    assert blocks["fp8"] >= 2 * blocks["auto"]
    with pytest.raises(SystemExit):
        main(["sim", "dualpath", "--kv-cache-dtype", "int8"])
    assert "invalid choice: 'int8'" in capsys.readouterr().err

def test_run_replays_a_trace_with_tp(tmp_path):
    out = tmp_path / "run.json"
    assert main(["sim", "run", "--model", "Yi-34B", "--gpu", "A100-80GB", "--tp", "2", "--policy", "sarathi",
                 "--workload", "azure-conv", "--time-scale", "0.2", "--num-requests", "30",
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["num_finished"] == 30


def test_capacity_finds_a_positive_qps(tmp_path):
    out = tmp_path / "cap.json"
    rc = main(["sim", "capacity", "--model", "Mistral-7B", "--gpu", "H100", "--policy", "sarathi",
               "--workload", "fixed", "--prompt-len", "256", "--output-len", "32", "--num-requests", "48",
               "--slo-tbt-p99", "0.1", "--start-qps", "4", "--max-probes", "6", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["capacity_qps"] > 0 and len(data["probes"]) <= 6
    assert all(p["passed"] == (p["qps"] <= data["capacity_qps"]) for p in data["probes"])


def test_reproduce_writes_rows(tmp_path, capsys):
    out = tmp_path / "rep.json"
    assert main(["sim", "reproduce", "--only", "paged-capacity-a100-40gb", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert {"id", "paper", "ours", "unit", "note"} <= row.keys()
    assert row["id"] == "paged-capacity-a100-40gb" and row["ours"] > 1
    assert "paged-capacity-a100-40gb" in capsys.readouterr().out


def test_calibration_and_list(capsys):
    assert main(["sim", "calibration"]) == 0
    assert "yi34b-tp2-prefill-1024" in capsys.readouterr().out
    assert main(["sim", "list"]) == 0
    assert "Qwen2.5-32B" in capsys.readouterr().out


def test_user_mistakes_get_one_line(capsys):
    assert main(["sim", "run", "--model", "GPT-5", "--qps", "1"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["sim", "run", "--workload", "sharegpt"]) == 2
    assert "--qps is required" in capsys.readouterr().err
    assert main(["sim", "run", "--qps", "1", "--cost-model", "measured"]) == 2
    assert "measured FILE" in capsys.readouterr().err


def test_bad_pool_flags_and_output_paths_give_one_clear_line_before_anything_runs(tmp_path, capsys):
    # --block-size 0 divided by zero, --num-gpu-blocks -5 failed in the block manager, and a --json that could
    # not be written failed after the run: all tracebacks.
    run = ["sim", "run", "--workload", "fixed", "--num-requests", "4", "--prompt-len", "64", "--output-len", "8",
           "--qps", "2"]
    for flags, message in ((["--block-size", "0"], "--block-size must be >= 1"),
                           (["--block-size", "-16"], "--block-size must be >= 1"),
                           (["--json", str(tmp_path)], "is a directory"),
                           (["--json", str(tmp_path / "missing" / "x.json")], "does not exist")):
        assert main([*run, *flags]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert main(["sim", "workload", "--workload", "agentic", "--out", str(tmp_path)]) == 2
    assert "--out" in capsys.readouterr().err
    for flag, value in (("--swap-space-gib", "-1"), ("--qps", "0"), ("--cv", "nan"), ("--prompt-len", "0"),
                        ("--num-gpu-blocks", "-5")):
        with pytest.raises(SystemExit):  # argparse: accepted until then (negative swap space ran)
            main([*run, flag, value])
        assert f"argument {flag}: expected a " in capsys.readouterr().err


def test_requests_the_pool_can_never_hold_are_counted_as_rejected(capsys):
    assert main(["sim", "run", "--workload", "fixed", "--num-requests", "4", "--prompt-len", "64", "--output-len",
                 "8", "--qps", "2", "--num-gpu-blocks", "1"]) == 0
    out = capsys.readouterr().out
    assert "num_finished           0" in out and "rejected               4" in out


def test_run_compares_migration_headrooms_across_replicas(tmp_path, capsys):
    out = tmp_path / "replicas.json"
    assert main(["sim", "run", "--model", "Llama-2-7B", "--gpu", "A40", "--workload", "longtail", "--qps", "12",
                 "--num-requests", "80", "--max-prompt-len", "512", "--pareto-min", "64", "--num-gpu-blocks", "200",
                 "--replicas", "3", "--migration-headroom", "0", "32", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["replicas"], r["migration_headroom"], r["num_finished"]) for r in runs] == [(3, 0, 80), (3, 32, 80)]
    assert runs[0]["migrations"] == 0 and runs[1]["migrations"] > 0
    printed = capsys.readouterr().out
    assert "migrations" in printed and "headroom 32 / 0: preemptions " in printed
    assert main(["sim", "run", "--qps", "1", "--migration-headroom", "32"]) == 2
    assert "give --replicas 2 or more" in capsys.readouterr().err
    assert main(["sim", "run", "--qps", "1", "--replicas", "2", "--migration-precopy"]) == 2
    assert "add --prefix-caching" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sim", "run", "--qps", "1", "--replicas", "0"])
    assert "argument --replicas: expected a " in capsys.readouterr().err


def test_run_compares_each_headroom_with_copying_ahead(tmp_path, capsys):
    out = tmp_path / "precopy.json"
    assert main(["sim", "run", "--model", "Llama-2-7B", "--gpu", "A40", "--workload", "longtail", "--qps", "12",
                 "--num-requests", "80", "--max-prompt-len", "512", "--pareto-min", "64", "--num-gpu-blocks", "200",
                 "--prefix-caching", "--replicas", "3", "--migration-headroom", "0", "32", "--migration-precopy",
                 "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["migration_headroom"], r["migration_precopy"]) for r in runs] == [(0, False), (32, False), (32, True)]
    assert runs[2]["precopied_blocks"] > 0 and runs[1]["precopied_blocks"] == 0
    printed = capsys.readouterr().out
    assert "32+copy" in printed and "headroom 32+copy / 0: preemptions " in printed
    assert "headroom 32+copy / 32: migration_pause_mean " in printed


def test_run_compares_priority_headrooms_with_each_class_shown(tmp_path, capsys):
    out = tmp_path / "priority.json"
    assert main(["sim", "run", "--model", "Llama-2-7B", "--gpu", "A40", "--workload", "longtail", "--qps", "12",
                 "--num-requests", "80", "--max-prompt-len", "512", "--pareto-min", "64", "--num-gpu-blocks", "200",
                 "--priority-mix", "0.2", "--replicas", "3", "--migration-headroom", "32", "--priority-headroom", "0",
                 "256", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["priority_headroom"] for r in runs] == [0, 256]
    assert all(r["workload"]["priority_mix"] == 0.2 and set(r["by_priority"]) == {"-1", "0"} for r in runs)
    printed = capsys.readouterr().out
    assert "32 p256" in printed and "headroom 32 p256 / 32 p0: preemptions " in printed
    assert "32 p256  priority -1: ttft_p99 " in printed
    assert main(["sim", "run", "--qps", "1", "--priority-headroom", "64"]) == 2
    assert "give --replicas 2 or more" in capsys.readouterr().err
