"""Fused C kernels for the CPU fp32 path (kernels.c: paged attention, RMSNorm, RoPE, SiLU·mul, argmax;
recurrent.c: linear-attention layers' short convolution, Gated DeltaNet's delta rule, Mamba's scans), built once per machine
into one library and loaded with ctypes.

Why built here rather than shipped: ``-march=native`` vectorises the inner loops for this CPU's widest units
(the decode kernel ran ~3x faster than gather + SDPA with it, ~1.7x without fast reductions), and a plain C
file compiles in well under a second, with no torch headers. The library lands in the cache dir under a name
that hashes the source, the flags, the compiler and this CPU's feature flags, so a changed source or a
different CPU gets its own build; concurrent builders each write a temp file and rename it into place.

No compiler, or a failed build → ``load`` logs why and returns None, and the engine keeps its torch path
(gather + SDPA), which gives the same tokens.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from services.engine.builtin_model import default_cache_dir

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = (HERE / "kernels.c", HERE / "recurrent.c")
HEADERS = (HERE / "vector_exp.h",)
# Fast reductions without -ffast-math: -ffast-math would link crtfastmath, which flips the whole process's
# floating-point mode (flush-to-zero) and changes torch's results too. These only let this file reassociate.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
         "-fno-trapping-math", "-shared", "-fPIC")

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_I = ctypes.c_int
# recurrent.c's fixed buffers: a convolution's window, a Gated DeltaNet head's key and value dims.
MAX_CONV_KERNEL = 8
MAX_HEAD_DIM = 256
MAX_STATE_SIZE = 512  # a Mamba-2 state's size per channel


class CpuKernels:
    """The loaded library's entry points over torch tensors. Every tensor is fp32 or int64 on the CPU."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self._decode = lib.seawall_paged_decode
        self._decode.restype = None
        self._decode.argtypes = [_P, _I64, _P, _I64, _P, _P, _I64, _I, _I, _I, _I, _I, _P, _I64, _P, _I, _I,
                                 ctypes.c_float, ctypes.c_float, _P, _P, ctypes.c_float]
        self._write = lib.seawall_kv_write
        self._write.restype = None
        self._write.argtypes = [_P, _P, _I64, _P, _I64, _P, _I64, _I, _P, _P, _I]
        self._gather_e4m3 = lib.seawall_gather_e4m3
        self._gather_e4m3.restype = None
        self._gather_e4m3.argtypes = [_P, _P, _I64, _I64, _P, _I64, ctypes.c_float]
        self._norm = lib.seawall_add_rms_norm
        self._norm.restype = None
        self._norm.argtypes = [_P, _I64, _P, _I64, _P, _I64, _P, _I, _I, ctypes.c_float]
        self._rope = lib.seawall_rope
        self._rope.restype = None
        self._rope.argtypes = [_P, _I64, _P, _P, _I, _I, _I, _I]
        self._silu_mul = lib.seawall_silu_mul
        self._silu_mul.restype = None
        self._silu_mul.argtypes = [_P, _I64, _P, _I64, _I, _I]
        self._prefill = lib.seawall_paged_prefill
        self._prefill.restype = None
        self._prefill.argtypes = [_P, _I64, _P, _I64, _P, _P, _I64, _I, _I, _I, _I, _I, _P, _P, _P, _P, _I64, _I,
                                  _I, ctypes.c_float, ctypes.c_float, _P, _P, ctypes.c_float]
        self._argmax = lib.seawall_argmax_rows
        self._argmax.restype = None
        self._argmax.argtypes = [_P, _P, _I64, _I, _I]
        self._conv = lib.seawall_causal_conv
        self._conv.restype = None
        self._conv.argtypes = [_P, _I64, _P, _I64, _P, _P, _I, _I, _P, _P, _I, _I, _I]
        self._delta = lib.seawall_gated_delta
        self._delta.restype = None
        self._delta.argtypes = [_P, _I64, _P, _P, _I64, _P, _I64, _P, _P, _I64, _P, _P, _I, _I, _I, _I, _I, _I,
                                ctypes.c_float]
        self._kda = lib.seawall_kda
        self._kda.restype = None
        self._kda.argtypes = [_P, _I64, _P, _P, _P, _I64, _P, _I64, _P, _I64, _P, _P, _I, _I, _I, _I, ctypes.c_float]
        self._mamba2 = lib.seawall_mamba2_scan
        self._mamba2.restype = None
        self._mamba2.argtypes = [_P, _I64, _P, _I64, _P, _P, _I64, _P, _I64, _P, _P, _P, _P, _P, _I, _I, _I, _I, _I,
                                 _I, _I, ctypes.c_float, ctypes.c_float]
        self._mamba1 = lib.seawall_mamba1_scan
        self._mamba1.restype = None
        self._mamba1.argtypes = [_P, _I64, _P, _I64, _P, _I64, _P, _I64, _P, _P, _I64, _P, _P, _P, _P, _P, _I, _I,
                                 _I, _I]

    # The wrappers run ~6 times per layer and pass: they check only what the C loops rely on (dtype, device,
    # innermost strides), cheaply (``is_cpu`` and ``empty_like`` cost a fraction of ``device.type`` and
    # ``empty(shape)``), and raise rather than assert, so a wrong tensor never reaches C even under -O.

    def paged_decode(self, out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, window: int | None = None,
                     softcap: float | None = None, sinks: torch.Tensor | None = None, chunk: int | None = None,
                     alibi: torch.Tensor | None = None, alibi_bf16: bool = False) -> None:
        """``out[i] = attention(q[i], the first context_lens[i] keys/values of block_tables[i])``; with a
        ``window``, the last ``window`` of them only (sliding-window attention); with a ``chunk``, those since the
        start of the query's chunk of ``chunk`` positions (Llama 4's chunked attention); with ``softcap``, each score
        s becomes ``softcap * tanh(s / softcap)`` (Gemma 2); with ``sinks`` (``[Hq]`` fp32, GPT-OSS), each
        head's softmax has one more logit, its sink, that weighs no value; with ``alibi`` (``[Hq]`` fp32 slopes: BLOOM,
        MPT), each score of key j gains ``slope * (j - context_lens[i] + 1)``; with ``alibi_bf16`` too (Falcon-RW,
        its slopes bf16 values), ``bf16(slope * bf16(j)) / sqrt(D)``, as transformers computes it.

        q, out ``[n, Hq, D]`` (rows may be strided, each row contiguous); caches ``[num_blocks, block_size,
        Hkv, D]`` with contiguous blocks (the pool's per-layer views); block_tables ``[n, max_blocks]`` int64
        contiguous; context_lens ``[n]`` int64."""
        n, hq, d = q.shape
        _, block_size, hkv, _ = k_cache.shape
        _check_rows(q)
        _check_rows(out)
        _check_cache(k_cache, v_cache)
        _check_index(block_tables, context_lens)
        self._decode(out.data_ptr(), out.stride(0), q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
                     k_cache.stride(0), block_size, hkv, d, hq // hkv, n, block_tables.data_ptr(),
                     block_tables.stride(0), context_lens.data_ptr(), window or 0, chunk or 0, d**-0.5,
                     softcap or 0.0, _per_head_ptr(sinks, hq, "sinks"), _per_head_ptr(alibi, hq, "ALiBi slopes"),
                     math.sqrt(d) if alibi_bf16 else 0.0)

    def paged_prefill(self, out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      token_starts: torch.Tensor, lens: torch.Tensor, prefix: torch.Tensor,
                      block_tables: torch.Tensor, window: int | None = None, softcap: float | None = None,
                      sinks: torch.Tensor | None = None, chunk: int | None = None,
                      alibi: torch.Tensor | None = None, alibi_bf16: bool = False) -> None:
        """Prompt chunk c: rows ``[token_starts[c], + lens[c])`` of q/out attend causally to the first
        ``prefix[c] + i + 1`` tokens of ``block_tables[c]`` (its K/V already written to the pool; with a
        ``window`` or a ``chunk``, those ``paged_decode`` leaves; ``softcap``, ``sinks``, ``alibi`` and ``alibi_bf16`` as in
        ``paged_decode``). Shapes as in
        ``paged_decode``; the index tensors are ``[num_chunks]`` (tables ``[num_chunks, max_blocks]``) int64."""
        _, hq, d = q.shape
        _, block_size, hkv, _ = k_cache.shape
        _check_rows(q)
        _check_rows(out)
        _check_cache(k_cache, v_cache)
        _check_index(token_starts, lens, prefix, block_tables)
        self._prefill(out.data_ptr(), out.stride(0), q.data_ptr(), q.stride(0), k_cache.data_ptr(),
                      v_cache.data_ptr(), k_cache.stride(0), block_size, hkv, d, hq // hkv, lens.shape[0],
                      token_starts.data_ptr(), lens.data_ptr(), prefix.data_ptr(), block_tables.data_ptr(),
                      block_tables.stride(0), window or 0, chunk or 0, d**-0.5, softcap or 0.0, _per_head_ptr(sinks, hq, "sinks"),
                      _per_head_ptr(alibi, hq, "ALiBi slopes"), math.sqrt(d) if alibi_bf16 else 0.0)

    def kv_write(self, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 slot_blocks: torch.Tensor, slot_offsets: torch.Tensor) -> None:
        """Writes token i's K/V rows ``[Hkv, D]`` into block ``slot_blocks[i]`` at ``slot_offsets[i]``."""
        _check_rows(k)
        _check_rows(v)
        _check_cache(k_cache, v_cache)
        _check_index(slot_blocks, slot_offsets)
        self._write(k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0), k.data_ptr(), k.stride(0),
                    v.data_ptr(), v.stride(0), k.shape[1] * k.shape[2], slot_blocks.data_ptr(),
                    slot_offsets.data_ptr(), k.shape[0])

    def gather_e4m3(self, cache: torch.Tensor, ids: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """Blocks ``ids`` (int64, contiguous) of a float8 e4m3 pool's layer view ``[num_blocks, block_size, Hkv,
        D]`` (contiguous inside a block) as fp32 ``[len(ids), block_size, Hkv, D]``, times ``scale``."""
        if cache.dtype is not torch.float8_e4m3fn or not cache.is_cpu or cache.dim() != 4 \
                or not cache[0].is_contiguous():
            raise ValueError(f"expected a float8_e4m3fn CPU [blocks, block_size, kv_heads, dim] cache, got "
                             f"{cache.dtype} {cache.device} {tuple(cache.shape)} strides {cache.stride()}")
        _check_index(ids)
        out = torch.empty((ids.numel(), *cache.shape[1:]), dtype=torch.float32)
        if ids.numel():
            if int(ids.min()) < 0 or int(ids.max()) >= cache.shape[0]:
                raise ValueError(f"block ids outside the pool of {cache.shape[0]} blocks")
            self._gather_e4m3(out.data_ptr(), cache.data_ptr(), cache.stride(0), cache[0].numel(), ids.data_ptr(),
                              ids.numel(), 1.0 if scale is None else scale)
        return out

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
        """RMSNorm of ``x`` ``[T, dim]``, or with ``residual``: ``residual += x`` (in place), then its RMSNorm."""
        rows, dim = x.shape
        _check_matrix(x, dim)
        _check_matrix(weight.view(1, -1), dim)
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        if residual is None:
            self._norm(out.data_ptr(), dim, x.data_ptr(), x.stride(0), None, 0, weight.data_ptr(), rows, dim, eps)
        else:
            _check_matrix(residual, dim)
            self._norm(out.data_ptr(), dim, x.data_ptr(), x.stride(0), residual.data_ptr(), residual.stride(0),
                       weight.data_ptr(), rows, dim, eps)
        return out

    def rope_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotates ``x`` ``[T, heads, D]`` in place (rows strided, heads contiguous); cos/sin ``[T, 1, R]``, R <= D
        (the first R features of each head rotate)."""
        t, heads, d = x.shape
        _check_rows(x)
        r = cos.shape[-1]
        if not (cos.is_contiguous() and sin.is_contiguous() and cos.numel() == sin.numel() == t * r
                and 2 <= r <= d and r % 2 == 0):
            raise ValueError(f"cos/sin must be contiguous [{t}, 1, R], R even and <= {d}, got "
                             f"{tuple(cos.shape)}/{tuple(sin.shape)}")
        self._rope(x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), t, heads, d, r)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of ``[T, 2 * I]`` rows whose halves are gate and up."""
        rows, cols = gate_up.shape
        _check_matrix(gate_up, cols)
        dim = cols // 2
        out = gate_up.new_empty((rows, dim))
        self._silu_mul(out.data_ptr(), dim, gate_up.data_ptr(), gate_up.stride(0), rows, dim)
        return out

    def argmax_rows(self, x: torch.Tensor) -> torch.Tensor:
        """``x.argmax(dim=-1)`` of a ``[rows, cols]`` matrix (first index on ties, NaN wins, as torch)."""
        rows, cols = x.shape
        _check_matrix(x, cols)
        out = torch.empty(rows, dtype=torch.long)
        self._argmax(out.data_ptr(), x.data_ptr(), x.stride(0), rows, cols)
        return out


    def causal_conv_(self, out: torch.Tensor, x: torch.Tensor, windows: torch.Tensor, slots: torch.Tensor,
                     length: int, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool) -> None:
        """Sequence s of ``slots`` (its rows ``[s * length, + length)`` of x and out ``[n, channels]``): out =
        the depthwise causal convolution of x after the inputs its window ``windows[slots[s]]`` (``[rows,
        channels, kernel - 1]``, contiguous) holds, then SiLU when ``silu``; the window then holds the last of
        them. ``weight``: conv1d's, ``[channels, 1, kernel]`` contiguous; ``bias``: ``[channels]``."""
        rows, channels = x.shape
        kernel = weight.shape[-1]
        _check_matrix(x, channels)
        _check_matrix(out, channels)
        if weight.dtype is not torch.float32 or not weight.is_cpu or not weight.is_contiguous() or \
                weight.numel() != channels * kernel:
            raise ValueError(f"expected conv1d's fp32 CPU contiguous weight [{channels}, 1, kernel], got "
                             f"{weight.dtype} {tuple(weight.shape)}")
        if bias is not None:
            _check_matrix(bias.view(1, -1), channels)
        if not (2 <= kernel <= MAX_CONV_KERNEL and windows.dtype is torch.float32 and windows.is_cpu
                and windows.is_contiguous() and windows.shape[1:] == (channels, kernel - 1)
                and rows == out.shape[0] == slots.shape[0] * length):
            raise ValueError(f"expected fp32 CPU windows [rows, {channels}, {kernel - 1}] (kernel <= "
                             f"{MAX_CONV_KERNEL}) and {slots.shape[0]} x {length} rows, got {windows.dtype} "
                             f"{tuple(windows.shape)} and {rows}")
        _check_slots(slots, windows.shape[0])
        self._conv(out.data_ptr(), out.stride(0), x.data_ptr(), x.stride(0), windows.data_ptr(), slots.data_ptr(),
                   slots.shape[0], length, weight.data_ptr(), None if bias is None else bias.data_ptr(),
                   channels, kernel, int(silu))

    def gated_delta_(self, out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, states: torch.Tensor, slots: torch.Tensor, length: int,
                     eps: float) -> None:
        """Gated DeltaNet's delta rule for sequence s of ``slots`` (rows ``[s * length, + length)``), from and
        into its state ``states[slots[s]]`` (``[rows, value heads, key dim, value dim]``, contiguous), one token
        at a time: q, k ``[n, key heads, Dk]`` (before their l2 norm), v, out ``[n, value heads, Dv]``, g (log
        decay), beta ``[n, value heads]``; q and k at one row stride."""
        n, hk, dk = q.shape
        _, hv, dv = v.shape
        for t in (q, k, v, out):
            _check_rows(t)
        _check_matrix(g, hv)
        _check_matrix(beta, hv)
        if not (k.shape == q.shape and k.stride(0) == q.stride(0) and out.shape == v.shape and g.stride(0) ==
                beta.stride(0) and n == v.shape[0] == g.shape[0] == beta.shape[0] == slots.shape[0] * length
                and hv % hk == 0 and max(dk, dv) <= MAX_HEAD_DIM):
            raise ValueError(f"q/k {tuple(q.shape)}, v/out {tuple(v.shape)}, g/beta {tuple(g.shape)} do not fit "
                             f"{slots.shape[0]} x {length} rows, value heads a multiple of key heads, head dims "
                             f"<= {MAX_HEAD_DIM}")
        _check_states(states, slots, (hv, dk, dv))
        self._delta(out.data_ptr(), out.stride(0), q.data_ptr(), k.data_ptr(), q.stride(0), v.data_ptr(),
                    v.stride(0), g.data_ptr(), beta.data_ptr(), g.stride(0), states.data_ptr(), slots.data_ptr(),
                    slots.shape[0], length, hk, hv, dk, dv, eps)

    def kda_(self, out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor, states: torch.Tensor, slots: torch.Tensor, length: int, eps: float) -> None:
        """Kimi Delta Attention for sequence s of ``slots`` (rows ``[s * length, + length)``), from and into its
        state ``states[slots[s]]`` (``[rows, heads, d, d]``, contiguous), one token at a time: q, k, v (before q
        and k's l2 norm; at one row stride), g (log decay per key channel), out ``[n, heads, d]``, beta ``[n,
        heads]``."""
        n, heads, d = q.shape
        for t in (q, k, v, g, out):
            _check_rows(t)
        _check_matrix(beta, heads)
        if not (k.shape == v.shape == g.shape == out.shape == q.shape and k.stride(0) == v.stride(0) == q.stride(0)
                and n == beta.shape[0] == slots.shape[0] * length and d <= MAX_HEAD_DIM):
            raise ValueError(f"q/k/v {tuple(q.shape)}, g {tuple(g.shape)}, beta {tuple(beta.shape)} do not fit "
                             f"{slots.shape[0]} x {length} rows of one shape at one stride, a head dim <= "
                             f"{MAX_HEAD_DIM}")
        _check_states(states, slots, (heads, d, d))
        self._kda(out.data_ptr(), out.stride(0), q.data_ptr(), k.data_ptr(), v.data_ptr(), q.stride(0), g.data_ptr(),
                  g.stride(0), beta.data_ptr(), beta.stride(0), states.data_ptr(), slots.data_ptr(), slots.shape[0],
                  length, heads, d, eps)

    def mamba2_scan_(self, y: torch.Tensor, x: torch.Tensor, b: torch.Tensor, c: torch.Tensor, dt: torch.Tensor,
                     a: torch.Tensor, d: torch.Tensor, dt_bias: torch.Tensor, states: torch.Tensor,
                     slots: torch.Tensor, length: int, dt_limit: tuple[float, float] | None) -> None:
        """Mamba-2's scan for sequence s of ``slots`` (rows ``[s * length, + length)``), from and into its state
        ``states[slots[s]]`` (``[rows, heads, head dim, state size]``, contiguous), one token at a time: x, y ``[n,
        heads, head dim]``, b, c ``[n, groups, state size]`` (at one row stride), dt ``[n, heads]`` (before its
        softplus), a (``-exp(A_log)``), d, dt_bias ``[heads]``; dt clamped to ``dt_limit`` when given."""
        n, heads, head_dim = x.shape
        _, groups, size = b.shape
        for t in (x, y, b, c):
            _check_rows(t)
        _check_matrix(dt, heads)
        for t in (a, d, dt_bias):
            _check_matrix(t.view(1, -1), heads)
        if not (c.shape == b.shape and c.stride(0) == b.stride(0) and y.shape == x.shape and heads % groups == 0
                and n == b.shape[0] == dt.shape[0] == slots.shape[0] * length and size <= MAX_STATE_SIZE):
            raise ValueError(f"x/y {tuple(x.shape)}, b/c {tuple(b.shape)}, dt {tuple(dt.shape)} do not fit "
                             f"{slots.shape[0]} x {length} rows, heads a multiple of groups, a state size <= "
                             f"{MAX_STATE_SIZE}")
        _check_states(states, slots, (heads, head_dim, size))
        lo, hi = dt_limit or (0.0, math.inf)
        self._mamba2(y.data_ptr(), y.stride(0), x.data_ptr(), x.stride(0), b.data_ptr(), c.data_ptr(), b.stride(0),
                     dt.data_ptr(), dt.stride(0), a.data_ptr(), d.data_ptr(), dt_bias.data_ptr(), states.data_ptr(),
                     slots.data_ptr(), slots.shape[0], length, heads, groups, head_dim, size, int(dt_limit is not None),
                     lo, hi)


    def mamba1_scan_(self, y: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, z: torch.Tensor, b: torch.Tensor,
                     c: torch.Tensor, a: torch.Tensor, d: torch.Tensor, dt_bias: torch.Tensor, states: torch.Tensor,
                     slots: torch.Tensor, length: int) -> None:
        """The first Mamba's scan (Jamba) for sequence s of ``slots`` (rows ``[s * length, + length)``), from and
        into its state ``states[slots[s]]`` (``[rows, channels, state size]``, contiguous), one token at a time: x,
        dt (before its softplus), z, y ``[n, channels]``, b, c ``[n, state size]`` (at one row stride), a
        (``-exp(A_log)``) ``[channels, state size]`` contiguous, d, dt_bias ``[channels]``; y is gated by SiLU(z)."""
        n, channels = x.shape
        size = b.shape[1]
        for t in (x, dt, z, y):
            _check_matrix(t, channels)
        _check_matrix(b, size)
        _check_matrix(c, size)
        for t in (d, dt_bias):
            _check_matrix(t.view(1, -1), channels)
        if not (a.is_contiguous() and a.shape == (channels, size) and c.stride(0) == b.stride(0)
                and n == b.shape[0] == c.shape[0] == dt.shape[0] == z.shape[0] == y.shape[0] == slots.shape[0] * length
                and size <= MAX_STATE_SIZE):
            raise ValueError(f"x {tuple(x.shape)}, b/c {tuple(b.shape)}, a {tuple(a.shape)} do not fit "
                             f"{slots.shape[0]} x {length} rows, a state size <= {MAX_STATE_SIZE}")
        _check_matrix(a, size)
        _check_states(states, slots, (channels, size))
        self._mamba1(y.data_ptr(), y.stride(0), x.data_ptr(), x.stride(0), dt.data_ptr(), dt.stride(0), z.data_ptr(),
                     z.stride(0), b.data_ptr(), c.data_ptr(), b.stride(0), a.data_ptr(), d.data_ptr(),
                     dt_bias.data_ptr(), states.data_ptr(), slots.data_ptr(), slots.shape[0], length, channels, size)


def _check_states(states: torch.Tensor, slots: torch.Tensor, shape: tuple[int, ...]) -> None:
    """A state pool a kernel updates in place: fp32 CPU contiguous ``[rows, *shape]``, ``slots`` among its rows."""
    if states.dtype is not torch.float32 or not states.is_cpu or not states.is_contiguous() or \
            states.shape[1:] != shape:
        raise ValueError(f"expected fp32 CPU contiguous states [rows, {', '.join(map(str, shape))}], got "
                         f"{states.dtype} {tuple(states.shape)}")
    _check_slots(slots, states.shape[0])


def _check_slots(slots: torch.Tensor, rows: int) -> None:
    """Rows of a state pool the kernel writes: contiguous int64 in [0, rows) (C would write anywhere)."""
    _check_index(slots)
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= rows):
        raise ValueError(f"state slots {slots.tolist()} outside the pool's {rows} rows")


def _check_matrix(t: torch.Tensor, cols: int) -> None:
    """fp32 on the CPU, ``[rows, cols]`` with contiguous rows at any row stride."""
    if t.dtype is not torch.float32 or not t.is_cpu or t.dim() != 2 or t.stride(1) != 1 or t.shape[1] != cols:
        raise ValueError(f"expected fp32 CPU [rows, {cols}] with contiguous rows, got {t.dtype} {t.device} "
                         f"{tuple(t.shape)} strides {t.stride()}")


def _check_rows(t: torch.Tensor) -> None:
    """fp32 on the CPU, ``[n, heads, dim]`` with each row's heads contiguous, any stride between rows."""
    if t.dtype is not torch.float32 or not t.is_cpu or t.dim() != 3 or t.stride(2) != 1 or t.stride(1) != t.shape[2]:
        raise ValueError(f"expected fp32 CPU [n, heads, dim] with contiguous heads, got {t.dtype} {t.device} "
                         f"{tuple(t.shape)} strides {t.stride()}")


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """One layer's K and V views of the pool: fp32 on the CPU, contiguous inside a block, the same block stride."""
    for c in (k_cache, v_cache):
        if c.dtype is not torch.float32 or not c.is_cpu or c.dim() != 4 or not c[0].is_contiguous():
            raise ValueError(f"expected fp32 CPU [blocks, block_size, kv_heads, dim] caches, got {c.dtype} "
                             f"{c.device} {tuple(c.shape)} strides {c.stride()}")
    if k_cache.stride(0) != v_cache.stride(0) or k_cache.shape != v_cache.shape:
        raise ValueError("K and V caches must have the same shape and block stride")


def _per_head_ptr(values: torch.Tensor | None, heads: int, what: str) -> int | None:
    """The address of one fp32 value per query head (sinks, ALiBi slopes), or None."""
    if values is None:
        return None
    if values.dtype is not torch.float32 or not values.is_cpu or not values.is_contiguous() or values.shape != (heads,):
        raise ValueError(f"expected {heads} contiguous fp32 CPU {what}, got {values.dtype} {values.device} "
                         f"{tuple(values.shape)}")
    return values.data_ptr()


def _check_index(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype is not torch.int64 or not t.is_cpu or not t.is_contiguous():
            raise ValueError(f"expected a contiguous int64 CPU tensor, got {t.dtype} {t.device} {tuple(t.shape)}")


@cache
def load(compiler: str | None = None) -> CpuKernels | None:
    """The kernels for this machine, built on first use; None (with the reason logged) when they cannot be."""
    cc = compiler or os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        log.warning("no C compiler %r on PATH: fused CPU kernels off, attention uses gather + SDPA", cc)
        return None
    try:
        path = _build(cc)
        return CpuKernels(ctypes.CDLL(str(path)), path)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("fused CPU kernels unavailable (%s): attention uses gather + SDPA", e)
        return None


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True, timeout=30).stdout
    texts = [f.read_text() for f in (*SOURCES, *HEADERS)]
    key = hashlib.sha256("\0".join([*texts, " ".join(FLAGS), version, _cpu_flags()]).encode())
    path = default_cache_dir() / "kernels" / f"seawall-cpu-{key.hexdigest()[:16]}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        built = Path(tmp) / path.name
        proc = subprocess.run([cc, *FLAGS, "-o", str(built), *map(str, SOURCES), "-lm"], capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            raise OSError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(built, path)
    log.info("built fused CPU kernels: %s", path)
    return path


def _cpu_flags() -> str:
    """This CPU's feature flags (what -march=native compiled for); empty where /proc/cpuinfo is absent."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""
