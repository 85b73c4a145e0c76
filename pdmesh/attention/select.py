"""Pick the attention backend an engine runs with; asking for one that is missing is an error.

"auto" picks the fused C++ kernels on CPU and says so when they cannot be built (a
warning naming the reason, and the engine reports the backend it runs), then uses the
torch backend, which computes the same thing more slowly.
"""

from __future__ import annotations

import logging

import torch

from pdmesh.attention.backend import AttentionBackend
from pdmesh.attention.torch_backend import TorchAttentionBackend
from pdmesh.errors import InvalidRequestError

log = logging.getLogger(__name__)


def _cpu(device: str) -> AttentionBackend:
    from pdmesh.attention.cpu_backend import CPUAttentionBackend

    return CPUAttentionBackend(device)


BACKENDS = {"torch": TorchAttentionBackend, "cpu": _cpu}
"""Every backend pdmesh ships. A GPU backend joins here when it exists."""


def build_backend(name: str, device: str) -> AttentionBackend:
    """``name`` is a key of ``BACKENDS`` or "auto" (the best one for ``device``)."""
    if name == "auto":
        if torch.device(device).type != "cpu":
            return TorchAttentionBackend(device)
        from pdmesh.attention.cpu_kernels import KernelsUnavailableError

        try:
            return _cpu(device)
        except KernelsUnavailableError as exc:
            log.warning("attention: %s; using the torch backend (slower decode)", exc)
            return TorchAttentionBackend(device)
    make = BACKENDS.get(name)
    if make is None:
        raise InvalidRequestError(
            "attention_backend", f"{name!r} is not available; choose one of {sorted(BACKENDS)} or 'auto'"
        )
    return make(device)
