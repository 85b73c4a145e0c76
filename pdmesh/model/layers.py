"""Building blocks of the decoder, written to reproduce Hugging Face's float32 results.

Operation order follows ``transformers``' Llama code (RMSNorm in float32, RoPE cos/sin from
``position * inv_freq`` in float32, residual adds outside the norms) because greedy
decoding on random-weight models is sensitive to the last ulp.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType

import torch
from torch import nn

from pdmesh.model import onednn
from pdmesh.model.linear_plan import LinearPlan, Product
from pdmesh.model.rope_config import RopeConfig

DEFAULT_PLAN = LinearPlan()
"""Each row range's product without a measurement (``linear_plan.DEFAULT_PRODUCTS``)."""

GATE_UP_BLOCK_BYTES = 16 << 20
"""The fused gate/up product of a long prefill chunk runs this many bytes of output at a
time: whole, a 2,048-token chunk's [2048, 4096] float32 output (32 MiB) is past the size
the allocator keeps for reuse, and every layer then faulted in fresh pages (262k minor
faults and 23% more time per prompt step on the default model; docs/performance/log.md,
section 23)."""


FewRows = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``linear_rows(x, weight) -> x @ weight.T`` from the CPU kernels (``csrc/linear_rows.cpp``)."""


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           few_rows: FewRows | None = None, packed: torch.Tensor | None = None,
           plan: LinearPlan = DEFAULT_PLAN) -> torch.Tensor:
    """``x @ weight.T + bias``, on CPU by the product ``plan`` takes for the flattened row
    count (``linear_plan``): oneDNN's with ``packed``, the weight in its layout; pdmesh's
    few-row kernel ``few_rows`` (for float32, where built; else as ``MM``); MKL's
    computed as ``(weight @ x.T).T``, whose result is a transposed view that every consumer
    here accepts; or ``F.linear``, which also serves 3-D inputs and other devices."""
    if x.device.type == "cpu":
        use = plan.product(x.numel() // x.shape[-1])
        if use is Product.ONEDNN:
            if packed is None:
                raise RuntimeError("a linear plan that runs oneDNN needs the weight packed (use_linear_plan)")
            flat = onednn.product(x.reshape(-1, x.shape[-1]), packed, bias)
            return flat.reshape(*x.shape[:-1], flat.shape[-1])
        if x.dim() == 2 and use is not Product.LINEAR:
            if (use is Product.KERNEL and few_rows is not None and x.dtype == torch.float32
                    and weight.dtype == torch.float32 and weight.is_contiguous()):
                y = few_rows(x, weight)
                return y.add_(bias) if bias is not None else y
            y = transposed_mm(x, weight)
            return y + bias if bias is not None else y
    return nn.functional.linear(x, weight, bias)


def transposed_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` as MKL's product of the tall weight and a few columns, ``(weight @
    x.T).T``: a transposed view (the ``MM`` product of ``linear_plan``)."""
    return torch.mm(weight, x.t()).t()


def takes_onednn(x: torch.Tensor, plan: LinearPlan) -> bool:
    """Whether ``x``'s product runs oneDNN's: on CPU, for a row count ``plan`` takes it for."""
    return x.device.type == "cpu" and plan.product(x.numel() // x.shape[-1]) is Product.ONEDNN


def few_rows_kernel(kernels: ModuleType | None) -> FewRows | None:
    """The CPU kernels' few-row product, where they were built with it (AVX2 + FMA)."""
    return getattr(kernels, "linear_rows", None)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, so Hugging Face weights load unchanged) computed
    with ``linear`` above."""

    few_rows: FewRows | None = None
    """The CPU kernels' few-row product when the engine runs them (``LlamaForCausalLM.use_kernels``)."""
    plan: LinearPlan = DEFAULT_PLAN
    """The product for each row count (``LlamaForCausalLM.use_linear_plan``)."""
    packed: torch.Tensor | None = None
    """oneDNN's copy of the weight, where ``plan`` runs oneDNN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.few_rows, self.packed, self.plan)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.offset = offset
        """What the checkpoint's weight lacks (Gemma stores w for a scale of 1 + w); the
        loader adds it to ``weight`` once (``LlamaForCausalLM.load_weights``)."""
        self.kernels: ModuleType | None = None
        """The CPU kernels (``pdmesh.attention.cpu_kernels``) when the engine runs them:
        float32 rows are then normalised in one pass instead of five."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and x.dtype == torch.float32 and x.dim() == 2 and x.stride(-1) == 1:
            return self.kernels.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies, including llama3 and linear scaling."""
    inv = 1.0 / (
        rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float) / head_dim)
    )
    if rope.rope_type == "linear":
        return inv / rope.factor
    if rope.rope_type == "yarn":
        return yarn_inv_freq(rope, head_dim)
    if rope.rope_type != "llama3":
        return inv
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def yarn_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """YaRN's inverse frequencies, in transformers' operation order: the fast-turning
    dimensions keep their own, the slow ones are divided by ``factor``, a linear ramp
    between the dimensions where they turn ``beta_fast`` and ``beta_slow`` times over the
    original context."""
    def dim_of(turns: float) -> float:
        return (head_dim * math.log(rope.original_max_position_embeddings / (turns * 2 * math.pi))) / (
            2 * math.log(rope.theta))

    low, high = dim_of(rope.beta_fast), dim_of(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    pos_freqs = rope.theta ** (torch.arange(0, head_dim, 2).to(dtype=torch.float) / head_dim)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (rope.factor * pos_freqs)
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    return interpolated * (1 - keep) + extrapolated * keep


def longrope_inv_freq(rope: RopeConfig, head_dim: int, long: bool) -> torch.Tensor:
    """LongRoPE's inverse frequencies: the base ones divided by the short or long factors."""
    ext = torch.tensor(rope.long_factor if long else rope.short_factor, dtype=torch.float32)
    return 1.0 / (ext * rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, indexed per token.

    LongRoPE (Phi-3) takes the short factors below ``original_max_position_embeddings`` and
    the long ones from there on, per position, and scales both tables by its attention
    factor. transformers instead switches a whole sequence to the long factors once it is
    longer than that, and keeps the keys it cached with the short ones: a token's rotation
    would then depend on how long its sequence grew, which no KV cache can share. Up to
    the original context the two agree exactly (tested); beyond it pdmesh rotates as
    vLLM does for a sequence that starts past it.
    """

    cos: torch.Tensor  # [max_positions, head_dim], registered buffers
    sin: torch.Tensor

    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int) -> None:
        super().__init__()
        positions = torch.arange(max_positions, dtype=torch.int64).float()[:, None]
        if rope.rope_type == "longrope":
            short, long = (longrope_inv_freq(rope, head_dim, f) for f in (False, True))
            cut = rope.original_max_position_embeddings
            freqs = torch.cat([positions[:cut] * short[None, :], positions[cut:] * long[None, :]])
        else:
            freqs = positions * rope_inv_freq(rope, head_dim)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = rope.attention_factor if rope.rope_type in ("longrope", "yarn") else 1.0
        self.register_buffer("cos", emb.cos() * scale, persistent=False)
        self.register_buffer("sin", emb.sin() * scale, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, 1, head_dim] cos and sin, broadcastable over heads."""
        return (
            self.cos[positions].to(dtype).unsqueeze(1),
            self.sin[positions].to(dtype).unsqueeze(1),
        )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return (x * cos) + (_rotate_half(x) * sin)


def apply_rope_(kernels: ModuleType | None, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> torch.Tensor:
    """``apply_rope`` with ``cos`` / ``sin`` as [T, 1, head_dim]: in place, in one pass, by
    the CPU kernel when it can (float32); otherwise into a new tensor."""
    if kernels is not None and x.dtype == torch.float32 and x.device.type == "cpu":
        kernels.rope_(x, cos.squeeze(1), sin.squeeze(1))
        return x
    return apply_rope(x, cos, sin)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), ``act`` SiLU or (Gemma) GELU's tanh approximation.

    gate and up are two weights (as checkpoints store them) and, where oneDNN's product
    serves, one packed weight with gate's rows then up's (``gate_up``): one product per
    layer instead of two, 0.13-0.18 ms less per decode step of one to four rows on the
    default model (docs/performance/log.md, section 23). Through MKL the fused product saved
    nothing at decode batch sizes and cost ~10% in prefill, so the other paths keep two.
    """

    def __init__(self, hidden: int, intermediate: int, bias: bool, activation: str = "silu") -> None:
        super().__init__()
        if activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"activation must be 'silu' or 'gelu_tanh', got {activation!r}")
        self.silu = activation == "silu"
        """SiLU, which the CPU kernels fuse with the product; else GELU (tanh) in torch ops."""
        self.gate = Linear(hidden, intermediate, bias=bias)
        self.up = Linear(hidden, intermediate, bias=bias)
        self.down = Linear(intermediate, hidden, bias=bias)
        self.kernels: ModuleType | None = None
        """The CPU kernels when the engine runs them: SiLU and the product in one pass."""
        self.gate_up: torch.Tensor | None = None
        """oneDNN's copy of gate's and up's weights stacked (``LlamaForCausalLM.use_linear_plan``)."""
        self.gate_up_bias: torch.Tensor | None = None

    def fuse_packed(self) -> None:
        """Pack gate's and up's weights as one, for the row counts gate's plan runs oneDNN for."""
        self.gate_up = onednn.pack(torch.cat([self.gate.weight, self.up.weight]))
        if self.gate.bias is not None and self.up.bias is not None:
            self.gate_up_bias = torch.cat([self.gate.bias, self.up.bias]).detach()

    @property
    def plan(self) -> LinearPlan:
        """gate's (the engine gives every layer one plan)."""
        return self.gate.plan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None and takes_onednn(x, self.plan):  # gate and up are not packed alone
            flat = x.reshape(-1, x.shape[-1])
            rows = max(64, GATE_UP_BLOCK_BYTES // (2 * self.down.in_features * x.element_size()))
            out = self._fused(flat) if flat.shape[0] <= rows else torch.cat([self._fused(p) for p in flat.split(rows)])
            return out.reshape(*x.shape[:-1], out.shape[-1])
        gate, up = self.gate(x), self.up(x)
        if self.silu and self.kernels is not None and gate.dtype == torch.float32 and gate.stride() == up.stride():
            self.kernels.silu_mul_(gate, up)  # one pass, in place
            return self.down(gate)
        return self.down(self._act(gate).mul_(up))

    def _fused(self, x: torch.Tensor) -> torch.Tensor:
        both = onednn.product(x, self.gate_up, self.gate_up_bias)  # type: ignore[arg-type]
        if self.silu and self.kernels is not None:
            return self.down(self.kernels.silu_mul_halves(both))
        gate, up = both.chunk(2, dim=-1)
        return self.down(self._act(gate).mul_(up))

    def _act(self, gate: torch.Tensor) -> torch.Tensor:
        """The activation into a fresh tensor, which the caller multiplies in place: one
        large temporary, not two."""
        return nn.functional.silu(gate) if self.silu else nn.functional.gelu(gate, approximate="tanh")
