"""Pick the attention backend an engine runs with; asking for one that is missing is an error."""

from __future__ import annotations

from pdmesh.attention.backend import AttentionBackend
from pdmesh.attention.torch_backend import TorchAttentionBackend
from pdmesh.errors import InvalidRequestError

BACKENDS = {"torch": TorchAttentionBackend}
"""Every backend pdmesh ships. A GPU backend joins here when it exists."""


def build_backend(name: str, device: str) -> AttentionBackend:
    """``name`` is a key of ``BACKENDS`` or "auto" (the best one for ``device``)."""
    if name == "auto":
        name = "torch"
    cls = BACKENDS.get(name)
    if cls is None:
        raise InvalidRequestError(
            "attention_backend", f"{name!r} is not available; choose one of {sorted(BACKENDS)} or 'auto'"
        )
    return cls(device)
