"""Linear-attention layers as their configs give them: which layers mix tokens by a recurrence instead of softmax
attention, and the shape of those layers: Gated DeltaNet (Qwen3-Next, Qwen3.5), Mamba-2 (Granite 4.0-H, Bamba,
Nemotron-H, Falcon-H1), Mamba (Jamba), LFM2's gated short convolution or Kimi Delta Attention (Kimi Linear). No
torch: the scheduler reads configs.

A linear-attention layer keeps no KV: each sequence carries a fixed-size recurrent state instead (a short
convolution window and one ``[value heads, key dim, value dim]`` matrix per layer; recurrent_state.py), which
depends on every token before it in order. So such a model's prefix cannot be taken from a cache, a forked
sequence or another worker by its KV blocks alone; ``ModelConfig.recurrent`` says so to the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.common.errors import ModelLoadError

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"


@dataclass(frozen=True)
class LinearAttentionShape:
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    # Qwen3-Next stores q, k, v and the output gate z as one projection grouped by key head (in_proj_qkvz), and
    # b and a as another (in_proj_ba); Qwen3.5 stores the four as separate projections, each in head order.
    grouped_projections: bool
    # OLMo Hybrid: beta doubled (its delta rule's eigenvalues may be negative), and its gated output norm's epsilon
    # (None: the model's rms_norm_eps).
    beta_scale: float = 1.0
    norm_eps: float | None = None
    # OLMo Hybrid stores q, k and v as projections of their own (loaded into in_proj_qkv, adapted apart).
    separate_qkv: bool = False

    def __post_init__(self) -> None:
        if not (self.beta_scale > 0 and (self.norm_eps is None or self.norm_eps > 0)) \
                or (self.separate_qkv and self.grouped_projections):
            raise ModelLoadError(f"linear attention: beta_scale and norm_eps must be > 0, and q/k/v stored apart "
                                 f"(separate_qkv) are not Qwen3-Next's grouped projections; got {self}")

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim

    @property
    def state_shape(self) -> tuple[int, ...]:
        """Each value head's state matrix: ``[value heads, key dim, value dim]``."""
        return (self.num_value_heads, self.key_head_dim, self.value_head_dim)

    def projections(self, hidden: int) -> dict[str, tuple[int, int]]:
        """The mixer's linear projections, (in, out) each, named as the model holds them in a layer."""
        heads, out = self.num_value_heads, {"linear_attn.out_proj": (self.value_dim, hidden)}
        if self.grouped_projections:
            return {"linear_attn.in_proj_qkvz": (hidden, 2 * self.key_dim + 2 * self.value_dim),
                    "linear_attn.in_proj_ba": (hidden, 2 * heads), **out}
        qkv = {f"linear_attn.{p}_proj": (hidden, width) for p, width in zip("qkv", self.qkv_widths, strict=True)} \
            if self.separate_qkv else {"linear_attn.in_proj_qkv": (hidden, self.conv_dim)}
        return {**qkv, "linear_attn.in_proj_z": (hidden, self.value_dim), "linear_attn.in_proj_b": (hidden, heads),
                "linear_attn.in_proj_a": (hidden, heads), **out}

    @property
    def qkv_widths(self) -> tuple[int, int, int]:
        """q's, k's and v's widths, side by side in in_proj_qkv."""
        return self.key_dim, self.key_dim, self.value_dim


GATED_NORMS = ("gate_then_norm", "norm_then_gate", "gate")


@dataclass(frozen=True)
class Mamba2Shape:
    """A Mamba-2 mixer (state space duality): ``num_heads`` heads of ``head_dim`` channels, each with a
    ``state_size`` state per channel; B and C shared by the heads of each of ``n_groups`` groups."""

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    conv_bias: bool
    proj_bias: bool
    time_step_limit: tuple[float, float]
    # A bias on out_proj where it differs from in_proj's (Falcon-H1's projectors_bias; None: proj_bias).
    out_proj_bias: bool | None = None
    # How the scan's output meets its gate: "gate_then_norm" (x * SiLU(z), RMS-normed in groups: Granite 4.0-H,
    # Bamba, Nemotron-H), "norm_then_gate" (normed, then gated: Falcon-H1's mamba_norm_before_gate) or "gate"
    # (no norm: Falcon-H1 without mamba_rms_norm).
    gated_norm: str = "gate_then_norm"
    # The norm's weight applied in fp32 before the cast back (Falcon-H1's), or after it (Granite's).
    norm_weight_in_fp32: bool = False
    # The gated norm's epsilon where it is not the model's rms_norm_eps (Zamba2's fixed 1e-5).
    norm_eps: float | None = None

    def __post_init__(self) -> None:
        if self.gated_norm not in GATED_NORMS:
            raise ModelLoadError(f"Mamba-2 gated_norm must be one of {', '.join(GATED_NORMS)}, got {self.gated_norm!r}")

    @property
    def intermediate(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def out_bias(self) -> bool:
        return self.proj_bias if self.out_proj_bias is None else self.out_proj_bias

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: x, B and C side by side."""
        return self.intermediate + 2 * self.n_groups * self.state_size

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.num_heads, self.head_dim, self.state_size)

    def projections(self, hidden: int) -> dict[str, tuple[int, int]]:
        """The mixer's linear projections, (in, out) each, named as the model holds them in a layer."""
        i = self.intermediate
        return {"mamba.in_proj": (hidden, i + self.conv_dim + self.num_heads), "mamba.out_proj": (i, hidden)}


@dataclass(frozen=True)
class Mamba1Shape:
    """A Mamba (selective state space, arXiv 2312.00752) mixer: ``intermediate`` channels, each with a
    ``state_size`` state and a step of its own, projected up from a ``dt_rank``-wide input."""

    intermediate: int
    state_size: int
    conv_kernel: int
    dt_rank: int
    conv_bias: bool
    proj_bias: bool
    # dt, B and C RMS-normed before the scan: "weighted" (Jamba's norms, the model's epsilon), "unweighted"
    # (Falcon Mamba's, ``bcdt_norm_eps``) or "none" (Mamba's).
    bcdt_norms: str = "weighted"
    bcdt_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.bcdt_norms not in ("weighted", "unweighted", "none"):
            raise ModelLoadError(f"Mamba bcdt_norms must be weighted, unweighted or none, got {self.bcdt_norms!r}")
        if not self.bcdt_norm_eps > 0:
            raise ModelLoadError(f"config.json: mixer_rms_eps must be > 0, got {self.bcdt_norm_eps}")

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: x alone."""
        return self.intermediate

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.intermediate, self.state_size)

    def projections(self, hidden: int) -> dict[str, tuple[int, int]]:
        """The mixer's linear projections, (in, out) each, named as the model holds them in a layer."""
        i = self.intermediate
        return {"mamba.in_proj": (hidden, 2 * i), "mamba.x_proj": (i, self.dt_rank + 2 * self.state_size),
                "mamba.dt_proj": (self.dt_rank, i), "mamba.out_proj": (i, hidden)}


@dataclass(frozen=True)
class ShortConvShape:
    """LFM2's gated short convolution: ``hidden_size`` channels, a ``conv_kernel``-wide window, biases or not. Its
    state is the window alone."""

    hidden_size: int
    conv_kernel: int
    bias: bool

    @property
    def conv_dim(self) -> int:
        return self.hidden_size

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (0,)

    def projections(self, hidden: int) -> dict[str, tuple[int, int]]:
        """The mixer's linear projections, (in, out) each, named as the model holds them in a layer."""
        return {"conv.in_proj": (hidden, 3 * hidden), "conv.out_proj": (hidden, hidden)}



@dataclass(frozen=True)
class KdaShape:
    """Kimi Delta Attention (Kimi Linear): ``num_heads`` heads of ``head_dim`` for q, k and v alike, each with a
    ``[head_dim, head_dim]`` state matrix; q, k and v through one short convolution."""

    num_heads: int
    head_dim: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        return 3 * self.num_heads * self.head_dim

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.num_heads, self.head_dim, self.head_dim)

    def projections(self, hidden: int) -> dict[str, tuple[int, int]]:
        """The mixer's linear projections, (in, out) each, named as the model holds them in a layer (q, k and v
        as checkpoints hold them: kda.py adds their adapters to its joined projection's thirds)."""
        width, d = self.num_heads * self.head_dim, self.head_dim
        return {**{f"self_attn.{p}_proj": (hidden, width) for p in "qkv"}, "self_attn.b_proj": (hidden, self.num_heads),
                "self_attn.f_a_proj": (hidden, d), "self_attn.f_b_proj": (d, width),
                "self_attn.g_a_proj": (hidden, d), "self_attn.g_b_proj": (d, width), "self_attn.o_proj": (width, hidden)}


@dataclass(frozen=True)
class LightningShape:
    """MiniMax's lightning attention: ``num_heads`` heads of ``head_dim`` for q, k and v alike, each with a
    ``[head_dim, head_dim]`` state that decays by a rate of its own per token (no convolution); prompts in
    blocks of ``block_size``."""

    num_heads: int
    head_dim: int
    block_size: int

    @property
    def conv_kernel(self) -> int:  # no short convolution: an empty window
        return 1

    @property
    def conv_dim(self) -> int:
        return 0

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.num_heads, self.head_dim, self.head_dim)

    def projections(self, hidden: int) -> dict[str, tuple[int, int]]:
        """The mixer's linear projections, (in, out) each, named as the model holds them in a layer."""
        width = self.num_heads * self.head_dim
        return {"self_attn.qkv_proj": (hidden, 3 * width), "self_attn.output_gate": (hidden, width),
                "self_attn.out_proj": (width, hidden)}


@dataclass(frozen=True)
class RgLruShape:
    """Griffin's recurrent block (RecurrentGemma): ``width`` channels through a short causal convolution, then a
    real-gated linear recurrence (RG-LRU) whose gates are block-diagonal in ``num_heads`` blocks; the state is one
    number a channel."""

    width: int
    num_heads: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        return self.width

    @property
    def state_shape(self) -> tuple[int, ...]:
        return (self.width,)

    def projections(self, hidden: int) -> dict[str, tuple[int, int]]:
        """The mixer's linear projections, (in, out) each, named as the model holds them in a layer."""
        w = self.width
        return {"self_attn.linear_x": (hidden, w), "self_attn.linear_y": (hidden, w), "self_attn.linear_out": (w, hidden)}


# Any linear layer's shape.
LinearShape = LinearAttentionShape | Mamba2Shape | Mamba1Shape | ShortConvShape | KdaShape | LightningShape | RgLruShape

def short_conv_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """``ModelConfig``'s ``linear_layers`` and ``linear_attention`` from an LFM2 config: its "conv" layers (or those
    ``full_attn_idxs`` leaves out; every layer attends by default, as transformers reads it)."""
    layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None:
        full = raw.get("full_attn_idxs")
        types = ["full_attention" if full is None or i in full else "conv" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or not set(types) <= {"conv", FULL_ATTENTION}:
        raise ModelLoadError(f"config.json: layer_types must name each of the {layers} layers conv or full_attention")
    shape = ShortConvShape(int(raw["hidden_size"]), int(raw.get("conv_L_cache") or 3), bool(raw.get("conv_bias")))
    if shape.conv_kernel < 2:
        raise ModelLoadError(f"config.json: conv_L_cache must be >= 2, got {shape.conv_kernel}")
    conv = tuple(i for i, t in enumerate(types) if t == "conv")
    return {"linear_layers": conv, "linear_attention": shape} if conv else {}


def mamba2_fields(raw: dict[str, Any], mamba_types: tuple[str, ...], width: int | None = None,
                  **shape: Any) -> dict[str, Any]:
    """``ModelConfig``'s ``linear_layers`` and ``linear_attention`` from a Granite 4.0 config (``mamba_*`` fields
    with transformers' defaults); ``mamba_types``: the layer_types that name its Mamba-2 layers; ``width``: the
    mixer's width where the model sets it otherwise than ``mamba_expand`` times the hidden size; ``shape``:
    ``Mamba2Shape`` fields of a model's own (Falcon-H1's)."""
    layers, hidden = int(raw["num_hidden_layers"]), int(raw["hidden_size"])
    types = raw.get("layer_types") or [mamba_types[0]] * layers
    heads = int(raw.get("mamba_n_heads") or 128)
    intermediate = width or int(raw.get("mamba_expand") or 2) * hidden
    head_dim = raw.get("mamba_d_head", "auto")
    head_dim = intermediate // heads if head_dim in (None, "auto") else int(head_dim)
    limit = raw.get("time_step_limit") or (0.0, float("inf"))
    mamba = Mamba2Shape(num_heads=heads, head_dim=head_dim, state_size=int(raw.get("mamba_d_state") or 256),
                        n_groups=int(raw.get("mamba_n_groups") or 1), conv_kernel=int(raw.get("mamba_d_conv") or 4),
                        chunk_size=int(raw.get("mamba_chunk_size") or 256),
                        conv_bias=bool(raw.get("mamba_conv_bias", True)), proj_bias=bool(raw.get("mamba_proj_bias")),
                        time_step_limit=(json_float(limit[0]), json_float(limit[1])), **shape)
    if mamba.intermediate != intermediate or heads % mamba.n_groups or mamba.conv_kernel < 2:
        field = "mamba_d_ssm" if width else "mamba_expand * hidden_size"
        raise ModelLoadError(f"config.json: Mamba-2 layers of {heads} heads of {head_dim} must fill {field} "
                             f"({intermediate}), in groups that divide the heads ({mamba.n_groups}), with a "
                             f"convolution of at least 2 ({mamba.conv_kernel})")
    return {"linear_layers": tuple(i for i, t in enumerate(types) if t in mamba_types), "linear_attention": mamba}


def json_float(value: Any) -> float:
    """A number as transformers writes it to JSON: infinities as ``{"__float__": "Infinity"}``."""
    return float(value["__float__"] if isinstance(value, dict) and "__float__" in value else value)


def linear_attention_fields(raw: dict[str, Any], grouped_projections: bool) -> dict[str, Any]:
    """``ModelConfig``'s ``linear_layers`` and ``linear_attention`` from a Qwen3-Next or Qwen3.5 config, with
    transformers' defaults (one full-attention layer in every ``full_attention_interval``, 4)."""
    layers = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None:
        interval = int(raw.get("full_attention_interval") or 4)
        types = [LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        raise ModelLoadError(f"config.json: layer_types must list one type per layer ({layers})")
    unknown = sorted({t for t in types if t not in (LINEAR_ATTENTION, FULL_ATTENTION)})
    if unknown:
        raise ModelLoadError(f"config.json: layer_types holds {', '.join(map(str, unknown))}; each layer is "
                             f"{LINEAR_ATTENTION} or {FULL_ATTENTION}")
    shape = LinearAttentionShape(
        num_key_heads=int(raw.get("linear_num_key_heads", 16)),
        num_value_heads=int(raw.get("linear_num_value_heads", 32)),
        key_head_dim=int(raw.get("linear_key_head_dim", 128)),
        value_head_dim=int(raw.get("linear_value_head_dim", 128)),
        conv_kernel=int(raw.get("linear_conv_kernel_dim", 4)),
        grouped_projections=grouped_projections,
    )
    if min(shape.num_key_heads, shape.num_value_heads, shape.key_head_dim, shape.value_head_dim) < 1 \
            or shape.conv_kernel < 2:
        raise ModelLoadError(f"config.json: linear attention needs positive head counts and widths and a convolution "
                             f"of at least 2, got {shape}")
    if shape.num_value_heads % shape.num_key_heads:
        raise ModelLoadError(f"config.json: linear_num_value_heads ({shape.num_value_heads}) must be a multiple of "
                             f"linear_num_key_heads ({shape.num_key_heads})")
    return {"linear_layers": tuple(i for i, t in enumerate(types) if t == LINEAR_ATTENTION),
            "linear_attention": shape}
