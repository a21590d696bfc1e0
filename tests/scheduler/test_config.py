"""The scheduler service's and the worker's configs refuse what cannot work, with a message that says why."""

from __future__ import annotations

import argparse

import pytest

from services.engine.config import EngineConfig
from services.scheduler.config import SchedulerServiceConfig
from services.worker.config import WorkerConfig


@pytest.mark.parametrize("kwargs, fragment", [
    ({"mode": "mixed"}, "mode must be one of"),
    ({"kv_transport": "rdma"}, "kv_transport must be one of"),
    ({"kv_read_policy": "both"}, "kv_read_policy must be one of"),
    ({"grpc_port": 70000}, "grpc_port must be in"),
    ({"metrics_port": -1}, "metrics_port must be in"),
    ({"kvcache_address": "kvcache"}, "host:port"),
    ({"max_queue_len": 0}, "max_queue_len must be >= 1"),
    ({"transfer_timeout_s": 0}, "transfer_timeout_s must be > 0"),
    ({"tool_call_parser": "xlam"}, "tool_call_parser must be one of hermes, llama3_json"),
    ({"reasoning_parser": "o1"}, "reasoning_parser must be one of deepseek_r1, qwen3"),
    ({"structured_output_in_reasoning": True}, "structured_output_in_reasoning needs a reasoning_parser"),
    ({"served_model_name": ("a", "a")}, "served_model_name must be distinct names"),
    ({"served_model_name": ("",)}, "served_model_name must be distinct names"),
    ({"api_key": " k"}, "api_key must be non-empty without surrounding spaces"),
    ({"api_key": ""}, "api_key must be non-empty"),
    ({"allowed_origins": ("ui.example",)}, "'ui.example' is no origin"),
    ({"allowed_origins": ("https://ui.example/app",)}, "is no origin"),
    ({"drain_timeout_s": -1.0}, "drain_timeout_s must be >= 0"),
    ({"drain_timeout_s": float("nan")}, "drain_timeout_s must be >= 0"),
    ({"chat_template": "{% if %}"}, "--chat-template does not compile"),
    ({"generation_config": ""}, "generation_config must be auto, vllm or a directory"),
    ({"override_generation_config": '{"temprature": 1}'}, "got temprature"),
])
def test_scheduler_service_config_rejects_what_cannot_work(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        SchedulerServiceConfig(**kwargs)


def test_origins_and_names_that_can_work_are_taken():
    config = SchedulerServiceConfig(allowed_origins=("*", "http://localhost:3000", "https://ui.example"),
                                    served_model_name=("tiny-chat", "org/tiny"), api_key="sk-1")
    assert "sk-1" not in repr(config)  # configs are logged


def test_defaults_are_valid_and_the_http_api_may_be_off():
    SchedulerServiceConfig(http_port=None, kvcache_address="127.0.0.1:50071")


@pytest.mark.parametrize("kwargs, fragment", [
    ({"role": "router"}, "role must be one of"),
    ({"metrics_port": 65536}, "metrics_port must be in"),
    ({"torch_threads": -1}, "torch_threads must be >= 0"),
    ({"compute_gbps": -1.0}, "compute_gbps must be >= 0"),
    ({"step_thread": "pool"}, "step_thread must be one of auto, loop, own"),
])
def test_worker_config_rejects_what_cannot_work(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        WorkerConfig(**kwargs)


def test_a_cpu_worker_runs_its_steps_on_the_event_loop_thread_unless_told_otherwise():
    cpu = EngineConfig(device="cpu")
    assert WorkerConfig(engine=cpu).steps_on_loop()
    assert not WorkerConfig(engine=cpu, step_thread="own").steps_on_loop()
    # A GPU's launches are asynchronous: its steps keep a thread of their own, and the loop stays free meanwhile.
    assert not WorkerConfig(engine=EngineConfig(device="cuda")).steps_on_loop()
    assert WorkerConfig(engine=EngineConfig(device="cuda"), step_thread="loop").steps_on_loop()


def test_the_chat_template_flags_reach_the_config_and_seawall_up_passes_them(tmp_path, monkeypatch):
    from services.scheduler.main import add_api_flags, add_served_model_name_flag, api_flags, parse_args

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jinja").write_text("{{ messages[0].content }}")
    config = parse_args(["--chat-template", "t.jinja", "--trust-request-chat-template"])
    assert config.chat_template == "{{ messages[0].content }}" and config.trust_request_chat_template
    assert parse_args([]).chat_template is None and not parse_args([]).trust_request_chat_template
    with pytest.raises(ValueError, match="looks like a file's path"):  # refused at start (exit 2)
        parse_args(["--chat-template", "missing.jinja"])
    up = argparse.ArgumentParser()
    add_api_flags(up)
    add_served_model_name_flag(up)
    args = up.parse_args(["--chat-template", "t.jinja", "--trust-request-chat-template", "--generation-config", "."])
    # Files by their absolute paths: the scheduler may run in another directory.
    assert api_flags(args) == ["--chat-template", str(tmp_path / "t.jinja"), "--trust-request-chat-template",
                               "--generation-config", str(tmp_path)]
    assert api_flags(up.parse_args(["--generation-config", "vllm", "--override-generation-config", '{"top_k": 1}'])) \
        == ["--generation-config", "vllm", "--override-generation-config", '{"top_k": 1}']
    with pytest.raises(ValueError, match="got topk"):  # a name generation_config.json does not have
        parse_args(["--override-generation-config", '{"topk": 1}'])
    assert api_flags(up.parse_args([])) == []  # auto: the scheduler's default
    assert parse_args(["--generation-config", "vllm"]).generation_config == "vllm"
