"""Griffin's recurrent block (RecurrentGemma's recurrent layers), over the recurrent states of a step's sequences
(recurrent_state.py), as transformers' ``RecurrentGemmaRecurrentBlock`` computes it.

Two branches of the layer's input: ``y = gelu(linear_y(x))``, and ``linear_x(x)`` through a short causal
convolution (with a bias, no activation) into the RG-LRU, a real-gated linear recurrence per channel::

    gate_x, gate_a = sigmoid(block-diagonal linear maps of the input)
    a = exp(-8 * gate_a * softplus(recurrent_param))
    h = a * h + sqrt(1 - a²) * (gate_x * input)        (at a sequence's first token: h = gate_x * input)

in fp32, token by token (as transformers' scan), its output cast back; the block's output is
``linear_out(h * y)``. Each sequence's state is the convolution's window and h.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.activations import ACTIVATIONS
from services.engine.attention import AttentionBatch
from services.engine.lora import adapted
from services.engine.model_config import ModelConfig
from services.engine.short_conv import causal_conv


class RgLru(nn.Module):
    """The RG-LRU's parameters, as transformers' ``RecurrentGemmaRglru`` holds them."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        block = width // heads
        self.recurrent_param = nn.Parameter(torch.empty(width))
        self.input_gate_weight = nn.Parameter(torch.empty(heads, block, block))
        self.input_gate_bias = nn.Parameter(torch.empty(heads, block))
        self.recurrent_gate_weight = nn.Parameter(torch.empty(heads, block, block))
        self.recurrent_gate_bias = nn.Parameter(torch.empty(heads, block))

    def inputs(self, x: torch.Tensor, reset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's scaled input and decay ``[T, width]`` (``reset`` ``[T, 1]``: a sequence's first token)."""
        t, width = x.shape
        heads = self.input_gate_weight.shape[0]
        blocks = x.reshape(t, heads, -1).permute(1, 0, 2)
        gate_x = torch.sigmoid(torch.baddbmm(self.input_gate_bias[:, None, :], blocks, self.input_gate_weight)
                               .transpose(0, 1).reshape(t, width))
        gate_a = torch.sigmoid(torch.baddbmm(self.recurrent_gate_bias[:, None, :], blocks, self.recurrent_gate_weight)
                               .transpose(0, 1).reshape(t, width))
        log_a = -8.0 * gate_a * F.softplus(self.recurrent_param)
        multiplier = reset + ~reset * torch.sqrt(1 - torch.exp(2 * log_a))
        return x * gate_x * multiplier.type(x.dtype), torch.exp(log_a) * ~reset


class RecurrentBlock(nn.Module):
    """One recurrent layer; ``forward`` takes Attention's arguments and reads ``batch.recurrent`` and
    ``batch.positions``."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        s = config.linear_attention
        self.state_index = config.linear_layers.index(layer)
        self.layer = layer  # its adapters'
        self.act = ACTIVATIONS[config.hidden_act]
        self.linear_x = nn.Linear(config.hidden_size, s.width)
        self.linear_y = nn.Linear(config.hidden_size, s.width)
        self.linear_out = nn.Linear(s.width, config.hidden_size)
        self.conv_1d = nn.Conv1d(s.width, s.width, s.conv_kernel, groups=s.width)
        self.rg_lru = RgLru(s.width, s.num_heads)

    def forward(self, x: torch.Tensor, cos, sin, batch: AttentionBatch, kv, lora, q_mult=None) -> torch.Tensor:
        rb = batch.recurrent
        y = self.act(adapted(self.linear_y, x, lora, self.layer, "self_attn.linear_y"))
        h = causal_conv(adapted(self.linear_x, x, lora, self.layer, "self_attn.linear_x"), rb, self.state_index,
                        self.conv_1d.weight, self.conv_1d.bias, silu=False, kernels=batch.kernels)
        inputs, decay = self.rg_lru.inputs(h, (batch.positions == 0)[:, None])
        ssm = rb.states.ssm[self.state_index]
        out = torch.empty_like(inputs)
        for grp in rb.groups:  # token by token, as transformers' scan (fp32 state, each output cast back)
            span, state = grp.tokens, ssm.index_select(0, grp.slots)
            xs, decays = (t[span].view(grp.count, grp.length, -1) for t in (inputs, decay))
            rows = out[span].view(grp.count, grp.length, -1)
            for i in range(grp.length):
                state = decays[:, i].float() * state + xs[:, i].float()
                rows[:, i] = state.type(out.dtype)
            rb.keep(ssm, grp, state)
        return adapted(self.linear_out, out * y, lora, self.layer, "self_attn.linear_out")
