"""Recurrent states of linear-attention layers (Gated DeltaNet, Mamba-2, Mamba, LFM2's short convolution): one slot
per sequence a worker holds.

A slot holds, for each linear layer, the last ``conv_kernel - 1`` inputs of its short convolution (the model's
dtype) and its state (``shape.state_shape``: Gated DeltaNet's ``[value heads, key dim, value dim]`` matrices,
Mamba-2's ``[heads, head dim, state size]``, fp32 as transformers keeps them; nothing for LFM2). Unlike KV,
a state is a summary of every token so far: it has one size whatever the length, is overwritten by each step,
and cannot be shared or resumed from part of a sequence. So it lives with the sequence on its worker from its
first token to its end (in host memory while its KV blocks are swapped out: ``swap_out``; a recompute starts
it again from zeros).

For prefix caching the scheduler has states saved as prompts pass the end of their last full block: a step's
group copies its new states to a checkpoint's row as well (``RecurrentBatch.keep``), and a sequence that starts
after a cached prefix claims a copy of it (services/scheduler/core/state_checkpoints.py). Checkpoints the
scheduler moves out of the device's slots wait in host memory (``move_checkpoint``), and are claimed from there.

Slots are rows of one tensor per layer and kind, so a step gathers and scatters a group of its sequences' states
(``RecurrentBatch``: the decodes, or prompt chunks of one length) with one ``index_select`` / ``index_copy_`` a
layer; the pool grows by doubling when every slot is taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from services.common.errors import InvalidArgument
from services.engine.linear_attention_config import LinearShape


class RecurrentStates:
    def __init__(self, shape: LinearShape, num_layers: int, dtype: torch.dtype,
                 device: torch.device, capacity: int = 8) -> None:
        self.shape, self.dtype, self.device = shape, dtype, device
        self.conv: list[torch.Tensor] = [self._conv_rows(capacity) for _ in range(num_layers)]
        self.ssm: list[torch.Tensor] = [self._ssm_rows(capacity) for _ in range(num_layers)]
        self._free = list(range(capacity - 1, -1, -1))
        # States read from the worker a sequence is handed off from, until a plan adds it: seq_id -> (tokens
        # they took in, each layer's bytes).
        self._arriving: dict[str, tuple[int, list[tuple[bytes, bytes]]]] = {}
        # Checkpoints saved for prefix caching (the scheduler's slot numbers -> rows here, taken on first use
        # and kept: the scheduler recycles the slots).
        self._checkpoint_rows: dict[int, int] = {}
        # States of swapped-out sequences, in host memory with their KV blocks: seq_id -> each layer's (conv, state).
        self._on_host: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        # Checkpoints the scheduler moved to host memory (its host slot numbers, after the device's): each layer's
        # (conv, state).
        self._host_checkpoints: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    @property
    def capacity(self) -> int:
        return self.conv[0].shape[0] if self.conv else 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_on_host(self) -> int:
        """States of swapped-out sequences held in host memory."""
        return len(self._on_host)

    @property
    def num_checkpoints(self) -> int:
        """Rows holding checkpoints saved for prefix caching (kept once taken)."""
        return len(self._checkpoint_rows)

    @property
    def num_host_checkpoints(self) -> int:
        """Checkpoints held in host memory."""
        return len(self._host_checkpoints)

    def acquire(self) -> int:
        """A free slot, its state zeroed (a sequence starts from no tokens)."""
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self.reset([slot])
        return slot

    def claim(self, seq_id: str, num_computed: int, checkpoint: int | None = None) -> int:
        """The slot of a sequence a plan adds: zeros for one that starts here, a copy of ``checkpoint`` for one
        that starts after a cached prefix, else the state stashed for it from the worker it was handed off from,
        which must have taken in exactly its ``num_computed`` tokens. Raises InvalidArgument otherwise (a prefix
        cached or moved here by its blocks alone cannot resume)."""
        if checkpoint is not None and num_computed:
            if checkpoint not in self._checkpoint_rows and checkpoint not in self._host_checkpoints:
                raise InvalidArgument(f"sequence {seq_id} starts from state checkpoint {checkpoint}, which this "
                                      "worker never saved")
            self._arriving.pop(seq_id, None)
            slot = self.acquire()
            if checkpoint in self._host_checkpoints:
                self._write_rows(slot, self._host_checkpoints[checkpoint])
            else:
                self.copy(self._checkpoint_rows[checkpoint], slot)
            return slot
        arrived = self._arriving.pop(seq_id, None)
        if num_computed and (arrived is None or arrived[0] != num_computed):
            raise InvalidArgument(
                f"sequence {seq_id} arrived with {num_computed} tokens computed elsewhere and "
                + ("no recurrent state" if arrived is None else f"a recurrent state of {arrived[0]} tokens")
                + "; this model's linear-attention layers need the state of exactly those tokens")
        slot = self.acquire()
        if num_computed:
            self.write(slot, arrived[1])
        return slot

    def stash(self, seq_id: str, num_computed: int, layers: list[tuple[bytes, bytes]]) -> None:
        """Keeps a handed-off sequence's state (``read``'s bytes, ``num_computed`` tokens in) until ``claim``."""
        if len(layers) != len(self.conv):
            raise InvalidArgument(f"{len(layers)} layers of recurrent state for a model with {len(self.conv)}")
        sizes = (self.dtype.itemsize * self.shape.conv_dim * (self.shape.conv_kernel - 1),
                 4 * math.prod(self.shape.state_shape))
        for i, layer in enumerate(layers):  # checked now: a plan adding the sequence must not fail on it
            if tuple(map(len, layer)) != sizes:
                raise InvalidArgument(f"layer {i} of the recurrent state of {seq_id} has {tuple(map(len, layer))} "
                                      f"(conv, ssm) bytes where this model's hold {sizes}")
        self._arriving[seq_id] = (num_computed, layers)

    def swap_out(self, seq_id: str, slot: int) -> None:
        """A swapped-out sequence's state to host memory; its slot is free."""
        self._on_host[seq_id] = self._host_copy(slot)
        self._free.append(slot)

    def on_host(self, seq_id: str) -> bool:
        return seq_id in self._on_host

    def swap_in(self, seq_id: str) -> int:
        """A slot holding the state ``swap_out`` moved to host memory."""
        slot = self.acquire()
        self._write_rows(slot, self._on_host.pop(seq_id))
        return slot

    def move_checkpoint(self, src: int, dst: int) -> None:
        """Device checkpoint ``src``'s state into host checkpoint ``dst`` (replacing what was there): the
        scheduler gives ``src``'s row to a newer save."""
        row = self._checkpoint_rows.get(src)
        if row is None:
            raise InvalidArgument(f"state checkpoint {src} was never saved on this worker: it cannot move")
        self._host_checkpoints[dst] = self._host_copy(row)

    def _host_copy(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # A copy even on a CPU worker, where the row itself is host memory: the row goes to others.
        return [(conv[row].to("cpu", copy=True), ssm[row].to("cpu", copy=True))
                for conv, ssm in zip(self.conv, self.ssm, strict=True)]

    def _write_rows(self, slot: int, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for conv, ssm, (conv_row, ssm_row) in zip(self.conv, self.ssm, layers, strict=True):
            conv[slot] = conv_row.to(conv.device)
            ssm[slot] = ssm_row.to(ssm.device)

    def release(self, seq_id: str, slot: int | None) -> None:
        """A sequence is gone: its slot (if it had one) is free, a state stashed or swapped out for it dropped."""
        self._arriving.pop(seq_id, None)
        self._on_host.pop(seq_id, None)
        if slot is not None:
            self._free.append(slot)

    def checkpoint_row(self, checkpoint: int) -> int:
        """The row that checkpoint slot ``checkpoint`` saves into (taken from the pool on its first save)."""
        row = self._checkpoint_rows.get(checkpoint)
        if row is None:
            row = self._checkpoint_rows[checkpoint] = self.acquire()
        return row

    def read_checkpoint(self, checkpoint: int) -> list[tuple[bytes, bytes]]:
        """``read``'s bytes of checkpoint slot ``checkpoint``: a prefix another worker reads from this one."""
        if checkpoint in self._host_checkpoints:
            return [(_bytes(conv), _bytes(ssm)) for conv, ssm in self._host_checkpoints[checkpoint]]
        row = self._checkpoint_rows.get(checkpoint)
        if row is None:
            raise InvalidArgument(f"state checkpoint {checkpoint} was never saved on this worker")
        return self.read(row)

    def copy(self, src: int, dst: int) -> None:
        """Row ``src``'s state into row ``dst``, every layer."""
        for conv, ssm in zip(self.conv, self.ssm, strict=True):
            conv[dst] = conv[src]
            ssm[dst] = ssm[src]

    def reset(self, slots: list[int]) -> None:
        """Zeroes the states of ``slots`` (sequences run again from their first token)."""
        if slots:
            index = torch.tensor(slots, device=self.device)
            for conv, ssm in zip(self.conv, self.ssm, strict=True):
                conv.index_fill_(0, index, 0)
                ssm.index_fill_(0, index, 0)

    def read(self, slot: int) -> list[tuple[bytes, bytes]]:
        """Each layer's (conv, state) bytes of ``slot``, row-major: what moves at a hand-off."""
        return [(_bytes(conv[slot]), _bytes(ssm[slot])) for conv, ssm in zip(self.conv, self.ssm, strict=True)]

    def blank(self) -> list[tuple[bytes, bytes]]:
        """``read``'s bytes of a state that took in nothing (zeros)."""
        return [(bytes(conv[0].numel() * conv.element_size()), bytes(ssm[0].numel() * ssm.element_size()))
                for conv, ssm in zip(self.conv, self.ssm, strict=True)]

    def write(self, slot: int, layers: list[tuple[bytes, bytes]]) -> None:
        """``read``'s bytes (from a worker with the same model and dtype) into ``slot``."""
        for conv, ssm, (conv_bytes, ssm_bytes) in zip(self.conv, self.ssm, layers, strict=True):
            conv[slot] = _tensor(conv_bytes, conv[slot])
            ssm[slot] = _tensor(ssm_bytes, ssm[slot])

    def nbytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in (*self.conv, *self.ssm))

    def _grow(self) -> None:
        old = self.capacity
        new = max(2 * old, 1)
        self.conv = [torch.cat([t, self._conv_rows(new - old)]) for t in self.conv]
        self.ssm = [torch.cat([t, self._ssm_rows(new - old)]) for t in self.ssm]
        self._free.extend(range(new - 1, old - 1, -1))

    def _conv_rows(self, n: int) -> torch.Tensor:
        s = self.shape
        return torch.zeros(n, s.conv_dim, s.conv_kernel - 1, dtype=self.dtype, device=self.device)

    def _ssm_rows(self, n: int) -> torch.Tensor:
        return torch.zeros(n, *self.shape.state_shape, dtype=torch.float32, device=self.device)


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).cpu().numpy().tobytes()


def _tensor(data: bytes, like: torch.Tensor) -> torch.Tensor:
    if len(data) != like.numel() * like.element_size():
        raise InvalidArgument(f"{len(data)} bytes of recurrent state where the layer holds "
                         f"{like.numel() * like.element_size()}")
    if not data:  # a mixer whose state is its convolution's window alone (LFM2): nothing else to hold
        return torch.empty_like(like)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(like.dtype).view(like.shape)


@dataclass(frozen=True)
class SpanGroup:
    """``count`` sequences of ``length`` tokens each, back to back in the flat batch from ``start``: the batch's
    decodes (length 1), or a run of prompt chunks of one length. ``slots``: their state slots, in that order."""

    start: int
    count: int
    length: int
    slots: torch.Tensor  # [count] int64
    # Rows a copy of the states after this group goes to as well (prefix caching's checkpoints), or None.
    save_to: torch.Tensor | None = None
    # Prompt chunks, of one token too (transformers runs every prompt token in its prefill form, decodes in its
    # recurrent one): the forms round differently in low precision, and Mamba-2 clamps dt in its prefill form only.
    prefill: bool = False

    @property
    def tokens(self) -> slice:
        return slice(self.start, self.start + self.count * self.length)


@dataclass
class RecurrentBatch:
    """Which state each sequence of a step's flat batch reads and writes, by groups of equal length that a layer
    runs as one batch: decodes first (one token each), then prompt chunks (fresh ones sorted by length, as the
    flat batch lays them out, then those after earlier chunks)."""

    states: RecurrentStates
    groups: list[SpanGroup]

    @staticmethod
    def keep(rows: torch.Tensor, group: SpanGroup, state: torch.Tensor) -> None:
        """Writes ``group``'s new states back into a layer's ``rows`` (conv windows or states), and into the
        checkpoint rows it saves to."""
        rows.index_copy_(0, group.slots, state)
        if group.save_to is not None:
            rows.index_copy_(0, group.save_to, state)

    @staticmethod
    def save(rows: torch.Tensor, group: SpanGroup) -> None:
        """After a kernel updated ``group``'s states in place in ``rows``: copies them to the checkpoint rows it
        saves to, if any."""
        if group.save_to is not None:
            rows.index_copy_(0, group.save_to, rows.index_select(0, group.slots))
