"""End-to-end fixtures: the mesh as real processes on loopback, and the transformers oracle."""

from __future__ import annotations

import functools
import os

import pytest
import torch

from seawall.launcher import LocalMesh, MeshOptions

# Where the mesh's workers run (fp32, the oracle's dtype): on a GPU machine, SEAWALL_TEST_DEVICE=cuda. The
# oracle (transformers) stays on the CPU.
DEVICE = os.environ.get("SEAWALL_TEST_DEVICE", "cpu")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir):
    """The built-in model loaded by transformers (the oracle)."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_greedy(hf_model):
    """``hf_greedy(prompt, max_tokens)``: the token ids transformers generates greedily, up to EOS."""
    return greedy_oracle(hf_model)


def greedy_oracle(model, make_cache=None):
    """``oracle(prompt, max_tokens)``: the token ids transformers ``model`` generates greedily, up to EOS
    (``make_cache``: the cache class it generates with, e.g. ``tests.kv_fp8_oracle.rounding_cache``'s)."""
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])

    @functools.cache
    def generate(prompt: tuple[int, ...], max_tokens: int) -> list[int]:
        ids = torch.tensor([prompt])
        # Every position attended: without a mask transformers masks out the pad id (0), which a prompt that
        # embeds generated tokens (a later turn) may hold.
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                                 pad_token_id=0, **({"cache": make_cache()} if make_cache else {}))
        ids = out[0, len(prompt):].tolist()
        return ids[: next((k + 1 for k, t in enumerate(ids) if t in eos), len(ids))]

    return lambda prompt, max_tokens: generate(tuple(prompt), max_tokens)


def greedy_misses(model, prompt: list[int], output: list[int], tol: float = 1e-4, make_cache=None) -> list[int]:
    """The positions of ``output`` where transformers ``model`` would not have chosen that token greedily, from
    one forward pass over prompt + output (teacher forcing): the same verdict as generating token by token
    and comparing (the first token that differs is not the greedy choice after a prefix both share), in one
    pass instead of one per token. A token within ``tol`` of the best logit counts as chosen: one pass over
    the whole sequence and one per token round differently, so a near-tie may go either way."""
    ids = torch.tensor([list(prompt) + list(output)])
    with torch.no_grad():
        logits = model(ids, attention_mask=torch.ones_like(ids),
                       **({"cache": make_cache()} if make_cache else {})).logits[0, len(prompt) - 1 : -1].float()
    chosen = logits.gather(1, torch.tensor(output)[:, None])[:, 0]
    return torch.nonzero(logits.max(-1).values - chosen > tol).flatten().tolist()


def start_mesh(model_dir, log_dir, mode="disaggregated", num_prefill=1, num_decode=1, scheduler_args=(),
               worker_args=(), http=True, kvcache_args=None, api_key=None) -> LocalMesh:
    """A mesh on free ports with small KV pools (so several fit in memory), logs under ``log_dir``."""
    options = MeshOptions(model=str(model_dir), mode=mode, num_prefill=num_prefill if mode != "colocated" else 0,
                          num_decode=num_decode, grpc_port=0, http_port=0 if http else None,
                          scheduler_args=list(scheduler_args),
                          worker_args=["--device", DEVICE, "--dtype", "float32", "--kv-cache-bytes", str(16 * 2**20),
                                       "--swap-bytes", str(16 * 2**20), *worker_args],
                          log_dir=log_dir, startup_timeout_s=180, kvcache=kvcache_args is not None,
                          kvcache_args=list(kvcache_args or ()), api_key=api_key)
    mesh = LocalMesh(options)
    mesh.start()
    return mesh


@pytest.fixture(scope="session")
def default_mesh(tiny_model_dir, tmp_path_factory):
    """The default topology (disaggregated: one prefill, one decode worker) with the HTTP API, shared."""
    m = start_mesh(tiny_model_dir, tmp_path_factory.mktemp("logs"), scheduler_args=["--chunk-size", "64"])
    yield m
    m.stop()


def random_prompts(lengths, vocab=4096, seed=99) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


async def generate_all(client, prompts: list[list[int]], **kwargs) -> list:
    """Every prompt's output from ``client`` (an ``AsyncClient``), all requests in flight at once."""
    import anyio

    outs: list = [None] * len(prompts)

    async def one(i: int) -> None:
        outs[i] = await client.generate(prompts[i], **kwargs)

    async with anyio.create_task_group() as tg:
        for i in range(len(prompts)):
            tg.start_soon(one, i)
    return outs


async def assert_blocks_move_through_kvcache(mesh, model, prompts: list[list[int]], max_tokens: int,
                                              session: str) -> None:
    """Greedy outputs of ``prompts`` through ``mesh`` (disaggregated, with a kvcache) equal ``model``'s, every
    block freed after; then a session's next turn after the last prompt equals it too, with turn 1's blocks
    (stored by kvcache) loaded for it."""
    from seawall import AsyncClient

    greedy = greedy_oracle(model)
    async with AsyncClient(mesh.grpc_address) as client:
        outs = await generate_all(client, prompts, max_tokens=max_tokens, temperature=0)
        stats = await client.stats()  # before the session, whose blocks stay held until kvcache stores them
        first = prompts[-1]
        turn1 = await client.generate(first, session_id=session, max_tokens=max_tokens, temperature=0)
        second = first + turn1.token_ids + [7, 8, 9]
        turn2 = await client.generate(second, session_id=session, max_tokens=8, temperature=0)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == greedy(prompt, max_tokens), f"the {len(prompt)}-token prompt diverged"
    assert turn2.token_ids == greedy(second, 8) and turn2.cached_prompt_tokens >= 96  # turn 1's blocks, loaded
    assert stats.num_running == 0 and all(w.num_device_blocks_used == 0 for w in stats.workers)
