"""Building blocks of the decoder, written to reproduce Hugging Face's float32 results.

Operation order follows ``transformers``' Llama code (RMSNorm in float32, RoPE cos/sin from
``position * inv_freq`` in float32, residual adds outside the norms) because greedy
decoding on random-weight models is sensitive to the last ulp.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from pdmesh.model.config import RopeConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, indexed per token."""

    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int) -> None:
        super().__init__()
        inv = rope_inv_freq(rope, head_dim)
        freqs = torch.arange(max_positions, dtype=torch.int64).float()[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

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


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)).

    gate and up stay two matmuls: fusing them into one saved nothing at decode batch sizes
    and cost ~10% in prefill on CPU (a larger GEMM, then SiLU over a strided half of it).
    """

    def __init__(self, hidden: int, intermediate: int, bias: bool) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=bias)
        self.up = nn.Linear(hidden, intermediate, bias=bias)
        self.down = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # silu into a fresh tensor, then multiply in place: one large temporary, not two.
        return self.down(nn.functional.silu(self.gate(x)).mul_(self.up(x)))
