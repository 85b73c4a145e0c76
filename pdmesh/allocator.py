"""Keep freed activation memory in the process instead of handing it back to the kernel.

Why: a prefill step allocates activations of tens of MiB (a 2,048-token chunk's MLP
output is 16 MiB in float32) and frees them before the next layer. glibc's malloc serves
such sizes with fresh ``mmap`` pages or trims them off the heap top once freed, and a
thread's own arena (the served engine steps in a thread) is a set of 64 MiB heaps it
unmaps as soon as one is empty: every step page-faults its activations back in, 200,000-
280,000 minor faults for 32 requests of 256 + 64 tokens on the default model, ~1.5-1.9 us
each on our VMs (docs/performance/log.md, section 10). vLLM-CPU preloads tcmalloc for the same
reason. Raising glibc's mmap threshold to its maximum, its trim threshold out of reach,
and keeping every thread on the main arena keeps those pages mapped and reused: no faults
once the heap has grown to the largest step. Call it before the process starts threads
(one that already has an arena of its own keeps it). Where another allocator is preloaded
(tcmalloc, jemalloc) it keeps its pages already, and nothing is changed.

Torch-free; Linux with glibc only (``mallopt``). Elsewhere ``keep_freed_memory`` reports
that it did nothing and why, which the worker logs at start-up.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
from dataclasses import dataclass

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_MAX = 32 * 2**20
"""glibc's upper bound for ``M_MMAP_THRESHOLD`` on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``);
larger allocations are always mmapped."""
TRIM_THRESHOLD = 2**31 - 1
"""``mallopt`` takes an int: the heap top is never trimmed below 2 GiB of free memory."""

_PRELOADED = ("tcmalloc", "jemalloc", "mimalloc")
OPT_OUT_ENV = "PDMESH_KEEP_FREED_MEMORY"
"""Set to 0 to leave glibc's defaults (a process then returns freed memory sooner)."""


@dataclass(frozen=True)
class AllocatorSetup:
    allocator: str
    """"glibc", the preloaded allocator's library name, "default" (opted out) or "unknown"."""
    tuned: bool
    """Whether this call changed glibc's thresholds."""
    detail: str
    """One line for the start-up log."""


def _preloaded() -> str:
    for lib in os.environ.get("LD_PRELOAD", "").replace(":", " ").split():
        name = os.path.basename(lib)
        if any(p in name for p in _PRELOADED):
            return name
    return ""


@functools.cache
def keep_freed_memory() -> AllocatorSetup:
    """Set glibc's mmap and trim thresholds and its arena count, once per process."""
    if os.environ.get(OPT_OUT_ENV, "1") == "0":
        return AllocatorSetup("default", False, f"allocator: defaults kept ({OPT_OUT_ENV}=0)")
    preloaded = _preloaded()
    if preloaded:
        return AllocatorSetup(preloaded, False, f"allocator {preloaded} (preloaded): left as it is")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return AllocatorSetup("unknown", False, "allocator: not glibc, thresholds left as they are")
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
    ok = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    ok = libc.mallopt(M_ARENA_MAX, 1) == 1 and ok
    if not ok:
        return AllocatorSetup("glibc", False, "allocator glibc: mallopt refused the thresholds, left as they are")
    return AllocatorSetup("glibc", True, f"allocator glibc: freed blocks up to {MMAP_THRESHOLD_MAX >> 20} MiB "
                                         "kept for reuse (mmap threshold raised, heap trimming off, one arena)")
