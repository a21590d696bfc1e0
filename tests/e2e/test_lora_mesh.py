"""LoRA adapters through the live mesh: requests select an adapter by its name in ``model`` (gRPC, the SDK,
the OpenAI API), any mix of adapters and the base model runs in one batch, and greedy output equals
``transformers`` + ``peft`` token for token in both modes, multi-turn sessions (KV stored to kvcache and
loaded back) included. Adapters load and unload at runtime; what names no served model gets NOT_FOUND / 404.
"""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from seawall import AsyncClient
from services.common.errors import NotFound
from tests.e2e.conftest import random_prompts, start_mesh
from tests.lora_adapters import peft_greedy

pytestmark = [pytest.mark.oracle, pytest.mark.slow, pytest.mark.anyio, pytest.mark.timeout(300)]

pytest.importorskip("peft")

MAX_TOKENS = 24
PROMPTS = random_prompts([5, 40, 70, 17, 33, 90], vocab=500, seed=5)
MODELS = ["", "alpha", "beta", "alpha", "beta", ""]


@pytest.fixture(scope="module")
def expected(tiny_model_dir, lora_dirs):
    return {name: peft_greedy(tiny_model_dir, lora_dirs[name] if name else None, PROMPTS, MAX_TOKENS)
            for name in ("", "alpha", "beta")}


@pytest.fixture(scope="module", params=["colocated", "disaggregated"])
def mesh(request, tiny_model_dir, lora_dirs, tmp_path_factory):
    m = start_mesh(tiny_model_dir, tmp_path_factory.mktemp("logs"), mode=request.param,
                   scheduler_args=["--chunk-size", "32", "--allow-runtime-lora-updating",
                                   "--lora-modules", *(f"{n}={p}" for n, p in lora_dirs.items())],
                   kvcache_args=[] if request.param == "disaggregated" else None)
    yield m
    assert all(code == 0 for code in m.stop().values())


async def test_mixed_adapters_in_one_batch_equal_peft(mesh, expected):
    outs = [None] * len(PROMPTS)
    async with AsyncClient(mesh.grpc_address) as client:
        async def one(i):
            outs[i] = await client.generate(PROMPTS[i], model=MODELS[i], max_tokens=MAX_TOKENS, temperature=0)

        async with anyio.create_task_group() as tg:
            for i in range(len(PROMPTS)):
                tg.start_soon(one, i)
        stats = await client.stats()
    for i, out in enumerate(outs):
        assert out.token_ids == expected[MODELS[i]][i], f"prompt {i} ({MODELS[i] or 'base'})"
    assert stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers)


async def test_a_session_turn_under_an_adapter_never_loads_another_models_kv(mesh, expected, tiny_model_dir,
                                                                            lora_dirs):
    first = PROMPTS[2]
    async with AsyncClient(mesh.grpc_address) as client:
        turn1 = await client.generate(first, model="alpha", session_id="s-lora", max_tokens=MAX_TOKENS,
                                      temperature=0)
        assert turn1.token_ids == expected["alpha"][2]
        second = first + turn1.token_ids + [7, 8, 9]
        want = {name: peft_greedy(tiny_model_dir, lora_dirs[name] if name else None, [second], 8)[0]
                for name in ("alpha", "")}
        again = await client.generate(second, model="alpha", session_id="s-lora", max_tokens=8, temperature=0)
        base = await client.generate(second, session_id="s-lora", max_tokens=8, temperature=0)
    assert again.token_ids == want["alpha"]
    assert again.cached_prompt_tokens >= 16 * (len(first) // 16)  # turn 1's KV, reused within the adapter
    assert base.token_ids == want[""]


async def test_openai_api_selects_lists_loads_and_unloads_adapters(mesh, expected, lora_dirs):
    async with httpx.AsyncClient(base_url=mesh.http_url, timeout=60) as http:
        models = (await http.get("/v1/models")).json()["data"]
        assert [m["id"] for m in models][1:] == ["alpha", "beta"]
        assert all(m["parent"] == models[0]["id"] for m in models[1:])

        async def complete(model: str, i: int) -> httpx.Response:
            return await http.post("/v1/completions", json={
                "model": model, "prompt": PROMPTS[i], "max_tokens": MAX_TOKENS, "temperature": 0,
                "return_token_ids": True})

        r = await complete("beta", 1)
        assert r.status_code == 200 and r.json()["model"] == "beta"
        assert r.json()["choices"][0]["token_ids"] == expected["beta"][1]

        r = await complete("gamma", 1)
        assert r.status_code == 404 and "'gamma' does not exist" in r.json()["error"]["message"]
        r = await http.post("/v1/load_lora_adapter", json={"lora_name": "gamma", "lora_path": str(lora_dirs["beta"])})
        assert r.status_code == 200, r.text
        r = await complete("gamma", 4)
        assert r.json()["choices"][0]["token_ids"] == expected["beta"][4]
        r = await http.post("/v1/load_lora_adapter", json={"lora_name": "gamma", "lora_path": str(lora_dirs["beta"])})
        assert r.status_code == 400 and "already loaded" in r.json()["error"]["message"]
        r = await http.post("/v1/load_lora_adapter", json={"lora_name": "delta", "lora_path": "/nowhere"})
        assert r.status_code == 400 and "cannot read adapter_config.json" in r.json()["error"]["message"]
        assert (await http.post("/v1/unload_lora_adapter", json={"lora_name": "gamma"})).status_code == 200
        assert (await complete("gamma", 4)).status_code == 404
        assert (await http.post("/v1/unload_lora_adapter", json={"lora_name": "gamma"})).status_code == 404

        chat = await http.post("/v1/chat/completions", json={
            "model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert chat.status_code == 200 and chat.json()["model"] == "alpha"


async def test_grpc_names_an_unknown_model_not_found(mesh):
    async with AsyncClient(mesh.grpc_address) as client:
        with pytest.raises(NotFound, match="'nope' does not exist here"):
            await client.generate([5, 6, 7], model="nope", max_tokens=2)


async def test_unloading_an_adapter_lets_its_running_requests_finish(mesh, lora_dirs):
    async with httpx.AsyncClient(base_url=mesh.http_url, timeout=120) as http:
        r = await http.post("/v1/load_lora_adapter", json={"lora_name": "eps", "lora_path": str(lora_dirs["alpha"])})
        assert r.status_code == 200
        body = {"model": "eps", "prompt": PROMPTS[0], "max_tokens": 600, "ignore_eos": True, "stream": True,
                "temperature": 0}
        texts, finish = 0, None
        async with http.stream("POST", "/v1/completions", json=body) as stream:
            async for line in stream.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                if texts == 0:  # the request runs: take its adapter away
                    assert (await http.post("/v1/unload_lora_adapter", json={"lora_name": "eps"})).status_code == 200
                texts += 1
                finish = json.loads(line[6:])["choices"][0]["finish_reason"] or finish
        assert finish == "length" and texts > 1
        assert (await http.post("/v1/completions", json={**body, "stream": False})).status_code == 404


async def test_an_activated_lora_loaded_at_runtime_applies_from_its_invocation(mesh, tiny_model_dir, tmp_path):
    """aLoRA: the scheduler salts its KV by where it applies from, each worker applies it from there (a
    disaggregated request's decode worker too); a prompt without its invocation gets the base model's output."""
    from tests.lora_adapters import make_adapter

    invocation = [301, 302, 303]
    path = make_adapter(tiny_model_dir, tmp_path / "alora", seed=9, r=8, lora_alpha=32, task_type="CAUSAL_LM",
                        alora_invocation_tokens=invocation, target_modules=["q_proj", "v_proj", "down_proj"])
    once = PROMPTS[2][:10] + invocation + PROMPTS[5][:51]
    # The last prompt invokes it again: its tokens between the two invocations run without the adapter, so the
    # first prompt's cached blocks (the same tokens, the adapter applied) are not its KV.
    prompts = [PROMPTS[2][:30] + invocation + PROMPTS[2][30:40], PROMPTS[3], PROMPTS[4] + invocation, once,
               once + invocation + PROMPTS[1][:5]]
    async with httpx.AsyncClient(base_url=mesh.http_url, timeout=60) as http:
        r = await http.post("/v1/load_lora_adapter", json={"lora_name": "act", "lora_path": str(path)})
        assert r.status_code == 200, r.text
        async with AsyncClient(mesh.grpc_address) as client:
            outs = [await client.generate(p, model="act", max_tokens=MAX_TOKENS, temperature=0) for p in prompts]
        assert (await http.post("/v1/unload_lora_adapter", json={"lora_name": "act"})).status_code == 200
    want = peft_greedy(tiny_model_dir, path, prompts, MAX_TOKENS)
    assert [o.token_ids for o in outs] == want
    base = peft_greedy(tiny_model_dir, None, prompts[:2], MAX_TOKENS)
    assert want[1] == base[1] and want[0] != base[0]  # not invoked: the base model's; invoked: the adapter's
