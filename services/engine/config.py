"""Engine configuration shared by the prefill and decode roles."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.common.errors import InvalidArgument

if TYPE_CHECKING:
    import torch

# Names only: the CLI and the scheduler build this config without importing torch (2-3 s), so torch is
# imported where a device or dtype is first needed.
_DTYPES = ("float32", "bfloat16", "float16")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's names; kv_quant.py maps them to torch's


def add_kv_cache_dtype_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="KV pool element type: auto (the model's dtype, default), or fp8 (= fp8_e4m3) / fp8_e5m2: "
                        "one byte per key and value element, 2x the tokens of bf16 (4x of fp32) in the same memory, "
                        "rounded")


@dataclass(frozen=True)
class EngineConfig:
    # Hugging Face checkpoint directory; None means the built-in model (created once in the cache dir).
    model: str | None = None
    # "cpu", "cuda", "cuda:N" or "auto" (CUDA when available).
    device: str = "auto"
    # "auto" = float32 on the CPU (token-exact with transformers), bfloat16 on CUDA.
    dtype: str = "auto"
    # Tokens per KV block.
    block_size: int = 16
    # Bytes of device memory for the KV pool; None = 256 MiB on the CPU, 90% of free memory on CUDA.
    kv_cache_bytes: int | None = None
    # The KV pool's element type (vLLM's --kv-cache-dtype): "auto" = the model's dtype; "fp8" (= "fp8_e4m3") or
    # "fp8_e5m2" store each key and value as one float8 byte (kv_quant.py): 2x the tokens of bf16 in the same
    # bytes, 4x those of fp32, at the cost of rounding them.
    kv_cache_dtype: str = "auto"
    # Bytes of host memory for swapped-out blocks.
    swap_bytes: int = 256 * 2**20
    # Fused C kernels for the CPU fp32 path: paged attention, norms, RoPE, SwiGLU, greedy argmax (built once
    # with the system C compiler; without one, or when False, these run as torch ops: same tokens, slower).
    cpu_kernels: bool = True
    # LoRA adapters kept loaded beyond those live sequences use (vLLM's --max-cpu-loras): a returning adapter
    # is not read from disk again.
    max_idle_loras: int = 8
    # The longest context served (vLLM's --max-model-len); None = the model's max_position_embeddings. It
    # picks LongRoPE's factors (rope.py) and bounds what the scheduler admits.
    max_model_len: int | None = None
    # A model with linear-attention layers (Qwen3-Next, Qwen3.5): sequences whose recurrent states the worker
    # allocates up front on CUDA, before the KV pool takes its share of free memory (the scheduler's default
    # max_num_seqs). More sequences grow the states past it; on the CPU they start small and grow. An
    # attention-free model's KV blocks (which hold nothing) are as many as this many sequences of the whole context.
    state_slots: int = 256
    # Such a model's prefix caching: how many states the worker keeps, each saved as a prompt passes the end of
    # its last full block, so that a later prompt starting with those blocks resumes there (0: no prefix
    # caching for such a model). Each is one sequence's state (Qwen3-Next-80B: 74 MiB in bf16), taken as used.
    state_checkpoints: int = 16
    # And how many more it keeps in host memory, where the device's least recently used go when a save needs
    # their slot (0: they are dropped). On a GPU these cost host RAM only (64 of Qwen3-Next-80B's: 4.7 GiB).
    host_state_checkpoints: int = 64
    # A model whose last layers write no KV of their own (Gemma 4's KV-sharing layers): those layers run only
    # the rows logits are taken from (vLLM's kv_sharing_fast_prefill, transformers' generate): no later token
    # reads the others. False: every row, as a forward pass without logits_to_keep (the bench's baseline).
    kv_sharing_fast_prefill: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise InvalidArgument(f"block_size must be a power of two >= 1, got {self.block_size}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise InvalidArgument(f"kv_cache_bytes must be > 0, got {self.kv_cache_bytes}")
        for name in ("cpu_kernels", "kv_sharing_fast_prefill"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgument(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.max_idle_loras < 0:
            raise InvalidArgument(f"max_idle_loras must be >= 0, got {self.max_idle_loras}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise InvalidArgument(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.state_slots < 1:
            raise InvalidArgument(f"state_slots must be >= 1, got {self.state_slots}")
        for name in ("state_checkpoints", "host_state_checkpoints"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name} must be >= 0 (0 = none), got {getattr(self, name)}")
        if self.swap_bytes < 0:
            raise InvalidArgument(f"swap_bytes must be >= 0, got {self.swap_bytes}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise InvalidArgument(f"dtype must be auto or one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidArgument(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.device != "auto" and not (self.device == "cpu" or self.device.startswith("cuda")):
            raise InvalidArgument(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")

    def torch_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self) -> torch.dtype:
        import torch

        if self.dtype == "auto":
            return torch.float32 if self.torch_device().type == "cpu" else torch.bfloat16
        return getattr(torch, self.dtype)

