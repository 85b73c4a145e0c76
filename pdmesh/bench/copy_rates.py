"""How fast one core copies KV blocks within its own memory: the floor under the mesh's
KV writes, beside raw NIXL's ceilings (``raw_nixl.py``).

On one host NIXL's UCX moves a write with ``cma``: the kernel's ``process_vm_writev``
copies the blocks with plain stores, and a plain store to a line that is not in cache
reads it from memory first. A mesh writes a request's blocks into a reservation no recent
write touched, so every destination line is read before it is written; raw NIXL rewriting
the same blocks finds them in cache and skips that read. These rates measure the two
kinds of store on blocks of the same size and memory (``kv_pool``), without NIXL:

- plain stores into blocks not in cache: what any copy through ``cma`` can reach;
- plain stores from blocks in cache into blocks not in cache: the most a write of blocks
  just computed could reach through ``cma`` (a write per layer, as each layer's KV is
  made), against the same copy with both ends in cache, which is what raw NIXL rewriting
  the same blocks measures;
- non-temporal stores into blocks not in cache: what a copy that writes whole lines
  without reading them reaches. Only a writer that maps the destination itself can issue
  those (UCX with ``xpmem``, which our hosts lack); the kernel's copy does not.

The copies are C (``csrc/copy_rates.c``) built with the host's C compiler at first use in
a process, so that no library's ``memcpy`` picks streaming stores on its own above some
size.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

_SOURCE = Path(__file__).with_name("csrc") / "copy_rates.c"
_BUILD_S = 120.0
"""A file of a few dozen lines builds in well under a second; a compiler still busy after
this is stuck."""


class CopyRatesUnavailableError(RuntimeError):
    """This host cannot build the copies: not x86-64, or no C compiler."""


@functools.cache
def _library() -> ctypes.CDLL:
    if platform.machine() not in ("x86_64", "AMD64"):
        raise CopyRatesUnavailableError(f"the copies are x86-64 (SSE2) code; this host is {platform.machine()}")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise CopyRatesUnavailableError("no C compiler (cc or gcc) on PATH to build the copies")
    # Built afresh in a private folder once per process (well under a second) and loaded
    # before the folder goes: nothing shared in /tmp that another user could have put there.
    with tempfile.TemporaryDirectory(prefix="pdmesh-copy-rates-") as tmp:
        built = Path(tmp) / "copy_rates.so"
        try:
            done = subprocess.run([cc, "-O2", "-shared", "-fPIC", str(_SOURCE), "-o", str(built)],
                                  capture_output=True, text=True, timeout=_BUILD_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CopyRatesUnavailableError(f"{cc} could not build {_SOURCE.name}: {e}") from e
        if done.returncode:
            raise CopyRatesUnavailableError(f"{cc} could not build {_SOURCE.name}: {done.stderr.strip()[:500]}")
        lib = ctypes.CDLL(str(built))
    for name in ("pdmesh_copy_stored", "pdmesh_copy_streamed"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        getattr(lib, name).restype = None
    return lib


def copy_blocks(dst: int, src: int, nbytes: int, streamed: bool) -> None:
    """Copy ``nbytes`` (a multiple of 64, both addresses 16-byte aligned) from ``src`` to
    ``dst`` with plain or non-temporal stores."""
    if nbytes % 64 or dst % 16 or src % 16:
        raise ValueError(f"copy_blocks needs 64-byte multiples at 16-byte aligned addresses, not "
                         f"{nbytes} bytes at {dst:#x} from {src:#x}")
    lib = _library()
    (lib.pdmesh_copy_streamed if streamed else lib.pdmesh_copy_stored)(dst, src, nbytes)


def copy_gib_s(block_bytes: int, blocks: int, streamed: bool = False,
               fresh_src: bool = False, fresh_dst: bool = False) -> float:
    """GiB/s of ``blocks``-block copies, a block at a time as NIXL's descriptors are, timed
    by the loop that times raw NIXL (``raw_nixl.timed_writes``: the same rounds and blocks,
    ``fresh_src`` / ``fresh_dst`` as there), in the same kind of memory."""
    import torch

    from pdmesh.bench.raw_nixl import pool_blocks, timed_writes
    from pdmesh.engine.kv_pool import kv_pool

    _library()  # fail before allocating
    size = pool_blocks(blocks, fresh_src or fresh_dst)
    src, _ = kv_pool((size, block_bytes // 4), torch.float32, torch.device("cpu"))
    dst, _ = kv_pool((size, block_bytes // 4), torch.float32, torch.device("cpu"))
    src.normal_()

    def write(src_ids: list[int], dst_ids: list[int]) -> None:
        for s, d in zip(src_ids, dst_ids):
            copy_blocks(dst[d].data_ptr(), src[s].data_ptr(), block_bytes, streamed)

    return timed_writes(block_bytes, blocks, write, fresh_src=fresh_src, fresh_dst=fresh_dst)
