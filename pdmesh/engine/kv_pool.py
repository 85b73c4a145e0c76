"""The KV pool tensor: zeroed, and in host memory on huge pages where the host allows.

One function for every pool a process copies KV in or out of with NIXL (the engine's, a
draft model's, the raw NIXL ceiling's in ``bench/raw_nixl.py``), so the ceiling is
measured on the same kind of memory the workers copy between.
"""

from __future__ import annotations

import math

import torch

from pdmesh.huge_pages import host_pool
from pdmesh.startup import set_phase


def kv_pool(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, str]:
    """The zeroed pool and a line saying what memory holds it. In host memory it is on
    transparent huge pages where the host allows (``huge_pages.py``: KV copies between
    processes cost ~30% less there)."""
    set_phase(f"touching the KV pool ({math.prod(shape) * dtype.itemsize / 2**30:.2f} GiB)")
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device), f"KV pool on {device}"
    count = math.prod(shape)
    pool = host_pool(count * dtype.itemsize)
    tensor = torch.frombuffer(pool.buffer, dtype=dtype, count=count, offset=pool.offset)
    return tensor.view(shape), "KV pool " + pool.detail
