"""Pick the attention backend an engine runs with; asking for one that is missing is an error.

"auto" picks the fused C++ kernels on CPU and says so when they cannot be built (a
warning naming the reason, and the engine reports the backend it runs), then uses the
torch backend, which computes the same thing more slowly. On CUDA it picks flashinfer
for bfloat16 and float16 where the package imports, and otherwise the torch backend
with a warning that says why (float32, which flashinfer does not compute, or the package
missing).
"""

from __future__ import annotations

import logging

import torch

from pdmesh.attention.backend import AttentionBackend
from pdmesh.attention.torch_backend import TorchAttentionBackend
from pdmesh.errors import InvalidRequestError

log = logging.getLogger(__name__)


def _cpu(device: str, dtype: torch.dtype, head_dim: int, variants: tuple[str, ...]) -> AttentionBackend:
    from pdmesh.attention.cpu_backend import CPUAttentionBackend

    return CPUAttentionBackend(device)


def _flashinfer(device: str, dtype: torch.dtype, head_dim: int, variants: tuple[str, ...]) -> AttentionBackend:
    from pdmesh.attention.flashinfer_backend import FlashInferBackend

    return FlashInferBackend(device, dtype, head_dim, variants)


def _torch(device: str, dtype: torch.dtype, head_dim: int, variants: tuple[str, ...]) -> AttentionBackend:
    return TorchAttentionBackend(device)


BACKENDS = {"torch": _torch, "cpu": _cpu, "flashinfer": _flashinfer}
"""Every backend pdmesh ships."""


def build_backend(name: str, device: str, dtype: torch.dtype, head_dim: int,
                  variants: tuple[str, ...] = ()) -> AttentionBackend:
    """``name`` is a key of ``BACKENDS`` or "auto" (the best one for ``device``, ``dtype``,
    the model's ``head_dim`` and the attention ``variants`` its layers use:
    ``ModelConfig.attention_variants``)."""
    if name == "auto":
        return _auto(device, dtype, head_dim, variants)
    make = BACKENDS.get(name)
    if make is None:
        raise InvalidRequestError(
            "attention_backend", f"{name!r} is not available; choose one of {sorted(BACKENDS)} or 'auto'"
        )
    return make(device, dtype, head_dim, variants)


def _auto(device: str, dtype: torch.dtype, head_dim: int, variants: tuple[str, ...]) -> AttentionBackend:
    kind = torch.device(device).type
    if kind == "cuda":
        try:  # FlashInferBackend says what it cannot compute (dtype, head size, variants, package)
            return _flashinfer(device, dtype, head_dim, variants)
        except InvalidRequestError as exc:
            log.warning("attention: %s; using the torch backend (gathers every context per layer)", exc.message)
            return TorchAttentionBackend(device)
    if kind != "cpu":
        return TorchAttentionBackend(device)
    from pdmesh.attention.cpu_kernels import KernelsUnavailableError

    try:
        return _cpu(device, dtype, head_dim, variants)
    except KernelsUnavailableError as exc:
        log.warning("attention: %s; using the torch backend (slower decode)", exc)
        return TorchAttentionBackend(device)
