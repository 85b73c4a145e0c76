"""Give the calling thread a name the kernel shows (``top -H``, ``/proc/*/task/*/comm``,
``pdmesh bench serve``'s CPU accounting).

Python's ``threading`` names live only inside the interpreter: every thread of a worker
reads ``python`` to the OS, so the CPU an engine thread, its OpenMP pool, the NIXL poller
and the event loop each burn cannot be told apart from outside. Threads created after the
call inherit the name (the engine thread's OpenMP workers read ``pdmesh-engine``), which
is what the accounting wants: they are the engine's compute.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_PR_SET_NAME = 15
_LIMIT = 15
"""The kernel keeps 16 bytes with the terminating NUL."""


def name_os_thread(name: str) -> bool:
    """Set the calling thread's kernel name (truncated to 15 bytes); False where the
    platform has no ``prctl`` (the name is a diagnostic, never needed for correctness)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_NAME, name.encode()[:_LIMIT], 0, 0, 0) == 0
    except OSError:
        return False
