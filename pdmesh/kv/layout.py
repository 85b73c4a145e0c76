"""The shape of a KV block, which every process that stores or moves blocks must agree on.

Torch-free on purpose: the kvstore and the router reason about blocks (bytes per block,
compatibility) without loading torch. The engine's pool tensor is
``[num_blocks, *KVLayout.block_shape]``, so one block across all layers is contiguous and
travels as one NIXL descriptor.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from math import prod

from pdmesh.cpu import has_native_bf16
from pdmesh.errors import UnsupportedModelError
from pdmesh.model.config import ModelConfig
from pdmesh.model.source import identity_name

log = logging.getLogger(__name__)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""The KV and weight dtypes pdmesh serves, by name, and their element size."""


def resolve_dtype_name(requested: str, cfg: ModelConfig, device: str = "cpu") -> str:
    """The dtype to run in: the one asked for, or for "auto" the config's (float32 if it
    names none) -- except half precision on a CPU without native bf16 instructions, where
    it is several times slower than float32: auto picks float32 there and logs why; and
    float32 on a GPU, where auto picks bfloat16 and logs it. The
    kvstore resolves "auto" as a CPU worker would; give it the workers' dtype when they
    run on GPUs."""
    name = requested
    if requested == "auto":
        name = cfg.torch_dtype if cfg.torch_dtype in DTYPE_BYTES else "float32"
        if name != "float32" and device.startswith("cpu") and not has_native_bf16():
            log.warning("dtype auto: the model says %s, but this CPU has no native bf16 "
                        "instructions (it runs several times slower than float32); using float32", name)
            name = "float32"
        elif name == "float32" and device.startswith("cuda"):
            log.warning("dtype auto: the model says float32; on %s weights and KV run in bfloat16 "
                        "(half the memory traffic, the tensor cores' rate); --dtype float32 keeps float32",
                        device)
            name = "bfloat16"
    if name not in DTYPE_BYTES:
        raise UnsupportedModelError(
            f"dtype={requested!r} is not supported; choose {sorted(DTYPE_BYTES)} or 'auto'"
        )
    return name


@dataclass(frozen=True, slots=True)
class KVLayout:
    num_layers: int
    block_size: int
    """Tokens per block."""
    num_kv_heads: int
    head_dim: int
    dtype: str
    """A key of ``DTYPE_BYTES``."""
    planes: int = 2
    """2: K and V per head; 1: one latent per token (MLA, ``num_kv_heads`` 1 and
    ``head_dim`` the latent's width)."""

    @classmethod
    def for_model(cls, cfg: ModelConfig, block_size: int, dtype: str) -> KVLayout:
        if cfg.mla is not None:
            return cls(cfg.num_layers, block_size, 1, cfg.mla.latent_dim, dtype, planes=1)
        return cls(cfg.num_layers, block_size, cfg.num_kv_heads, cfg.head_dim, dtype)

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """``(layers, K/V or latent, block_size, kv_heads, head_dim)``: one block, all layers."""
        return (self.num_layers, self.planes, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def block_bytes(self) -> int:
        return prod(self.block_shape) * DTYPE_BYTES[self.dtype]

    def compat_hash(self, model: str, hash_algorithm: str, hash_seed: int) -> str:
        """Digest of what two processes must share to exchange KV blocks and block hashes."""
        blob = json.dumps([identity_name(model), self.dtype, self.block_size, hash_algorithm,
                           hash_seed, list(self.block_shape)])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
