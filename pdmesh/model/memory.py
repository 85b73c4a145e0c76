"""Will the model and its KV pool fit? Answered before anything is loaded.

A mixture-of-experts checkpoint is several times the size of a dense model with the same
speed, and a worker that runs out of memory halfway through loading it dies to the
kernel's OOM killer with nothing in its log. The weights' size at the dtype they will run
in is read from the safetensors headers (no tensor is read), the KV pool's from the engine
options, and both are compared with what the device has free: host memory's
``MemAvailable``, or the GPU's free memory.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from pdmesh.errors import PdmeshError

GIB = 2**30
_ELEMENT = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1}


class InsufficientMemoryError(PdmeshError):
    """The weights and the KV pool asked for do not fit the memory the device has free."""


def checkpoint_elements(files: list[Path]) -> int:
    """Elements of every tensor in these safetensors files, from their headers alone."""
    total = 0
    for file in files:
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name == "__metadata__" or entry["dtype"] not in _ELEMENT:
                continue
            count = 1
            for dim in entry["shape"]:
                count *= int(dim)
            total += count
    return total


def host_available_bytes() -> int:
    """``MemAvailable`` from /proc/meminfo (what the kernel can give without swapping)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("/proc/meminfo has no MemAvailable")


def check_fits(weights_bytes: int, kv_bytes: int, available: int, where: str) -> None:
    """Refuse, with the three figures, a start that cannot fit."""
    if weights_bytes + kv_bytes > available:
        raise InsufficientMemoryError(
            f"the model's weights ({weights_bytes / GIB:.2f} GiB at the dtype they run in) and the KV pool "
            f"({kv_bytes / GIB:.2f} GiB) need {(weights_bytes + kv_bytes) / GIB:.2f} GiB, and {where} has "
            f"{available / GIB:.2f} GiB free; lower --kv-cache-memory-gb / --num-blocks, use a smaller dtype, "
            "or a machine with more memory")
