"""What this CPU can do, read once from ``/proc/cpuinfo`` (torch-free).

Used to key the C++ kernels' build cache (they are compiled for this CPU) and to decide
what ``dtype="auto"`` means on CPU: without native bf16 instructions (AVX-512 BF16 or
AMX on x86, the BF16 extension on Arm), bf16 runs several times slower than float32
(measured ~5x on an AVX2-only EPYC), so auto picks float32 there.
"""

from __future__ import annotations

import functools
from pathlib import Path

_NATIVE_BF16 = {"avx512_bf16", "amx_bf16", "bf16"}


@functools.cache
def cpu_flags() -> str:
    """The CPU's feature flags, sorted and space-separated; "" where unknown."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return ""


def has_native_bf16(flags: str | None = None) -> bool:
    return bool(_NATIVE_BF16 & set((cpu_flags() if flags is None else flags).split()))
