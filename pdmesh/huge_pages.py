"""Host memory for KV pools, on transparent huge pages where the host allows them.

Why: between processes on one host a KV write is a kernel copy (UCX's ``cma``,
``process_vm_writev``) that pins the other process's pages and copies page by page. Raw
NIXL between two processes on 2 cores moved 16-block (4 MiB) writes at 10.8-11.0 GiB/s
with both pools on 2 MiB pages against 7.7-7.9 GiB/s on 4 KiB pages, and 5.4-5.5 against
3.7-4.0 GiB/s into blocks not in cache (docs/performance/log.md §34, §35). Our hosts run THP in
``madvise`` mode, so a pool gets huge pages only when it asks for them.

The pool is an anonymous mapping 2 MiB larger than asked, so that a 2 MiB-aligned start
exists in it; that part is advised ``MADV_HUGEPAGE`` and, for a worker's pool, touched page
by page, so serving never faults a page in (the kernel hands out huge pages at that first
touch; the kvstore's pool faults in as it is used, 2 MiB at a time).
Where the host has THP off, or the call is refused, the pool is the same mapping on
ordinary pages and ``detail`` says why. Torch-free: the kvstore wraps it in numpy, workers
in torch.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HUGE_PAGE = 2 * 2**20
MADV_HUGEPAGE = 14
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class HostPool:
    """``nbytes`` of zeroed, touched memory at ``offset`` in ``buffer`` (which the pool's
    array must keep alive: ``torch.frombuffer`` and ``numpy.frombuffer`` hold it)."""

    buffer: mmap.mmap
    offset: int
    nbytes: int
    huge: bool
    detail: str
    """One line for the start-up log."""


def _thp_mode() -> str:
    """The host's THP mode ("always", "madvise", "never"), "" where it has none."""
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return ""
    return text[text.index("[") + 1:text.index("]")] if "[" in text else ""


def _advise(address: int, nbytes: int) -> str:
    """Ask for huge pages over the range; "" when granted, else why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.madvise(address, nbytes, MADV_HUGEPAGE) != 0:
        return f"madvise(MADV_HUGEPAGE) refused (errno {ctypes.get_errno()})"
    return ""


def host_pool(nbytes: int, touch: bool = True) -> HostPool:
    """Zeroed host memory for a pool of ``nbytes``; ``touch``: every page faulted in before
    it is returned (a worker's pool, which it fills at once), else at first use (the
    kvstore's, sized to the host's spare memory, used as blocks are offloaded to it)."""
    if nbytes <= 0:
        raise ValueError(f"a pool needs a positive size, not {nbytes} bytes")
    buffer = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = ctypes.c_char.from_buffer(buffer)
    address = ctypes.addressof(view)
    del view  # no export left: only the arrays made over the buffer hold it
    offset = -address % HUGE_PAGE
    mode = _thp_mode() if sys.platform == "linux" else ""
    if mode in ("always", "madvise"):
        refused = _advise(address + offset, nbytes)
        huge = not refused
        detail = f"on 2 MiB pages (THP {mode})" if huge else f"on 4 KiB pages: {refused}"
    else:
        huge = False
        detail = "on 4 KiB pages: " + (f"THP is {mode} on this host" if mode else "no transparent huge pages here")
    if touch:
        _touch(buffer, offset, nbytes)
    return HostPool(buffer, offset, nbytes, huge, detail)


def _touch(buffer: mmap.mmap, offset: int, nbytes: int) -> None:
    """Fault every page in now: a zero written to each 4 KiB page (the mapping is zero
    already), strided in numpy, so a pool of tens of GiB is not millions of Python steps."""
    np.frombuffer(buffer, dtype=np.uint8, count=nbytes, offset=offset)[::mmap.PAGESIZE] = 0
