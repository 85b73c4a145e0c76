"""Build (once per machine) and load pdmesh's C++ CPU kernels (``csrc/``).

They are compiled with torch's cpp_extension on first use and cached in torch's extension
folder. The module name carries a digest of the sources, the torch version and this CPU's
instruction-set flags: the kernels are built with ``-march=native``, and a cache built on
an AVX-512 machine must never be loaded on an AVX2-only one.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from pathlib import Path
from types import ModuleType

import torch

from pdmesh.cpu import cpu_flags
from pdmesh.errors import PdmeshError

log = logging.getLogger(__name__)
SOURCES = tuple(Path(__file__).parent / "csrc" / f
                for f in ("module.cpp", "paged_attention.cpp", "paged_prefill.cpp", "elementwise.cpp",
                          "linear_rows.cpp", "kv_write.cpp"))
HEADERS = tuple(Path(__file__).parent / "csrc" / f for f in ("vec_math.h", "shared_rows.h"))
CFLAGS = ("-O3", "-march=native", "-fopenmp")
"""How the kernels are compiled (``scripts/linear_rows_avx2.py`` adds ``-mno-avx512f``)."""
LDFLAGS = ("-fopenmp",)


class KernelsUnavailableError(PdmeshError):
    """The C++ kernels could not be built or loaded here (no compiler, no ninja ...)."""


def module_name(flags: str) -> str:
    """The cached build's name for these CPU flags (and these sources, this torch)."""
    digest = hashlib.sha256()
    for src in SOURCES + HEADERS:
        digest.update(src.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(flags.encode())
    return f"pdmesh_cpu_kernels_{digest.hexdigest()[:12]}"


def tree_module_name(csrc: Path, extra_cflags: tuple[str, ...] = ()) -> str:
    """The cached build's name for another checkout's kernels (its ``pdmesh/attention/csrc``)
    built with ``extra_cflags``: a digest of every file there (sources, headers) and the flags,
    so two trees that differ in a header alone never share a build."""
    digest = hashlib.sha256(" ".join(extra_cflags).encode())
    for path in sorted(p for p in csrc.iterdir() if p.is_file()):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(torch.__version__.encode())
    return f"pdmesh_tree_kernels_{digest.hexdigest()[:12]}"


def build_tree(csrc: Path, extra_cflags: tuple[str, ...] = ()) -> ModuleType:
    """Another checkout's kernels, built as ``load`` builds these plus ``extra_cflags``
    (``-mno-avx512f``: the code an AVX2-only machine runs): for scripts that time two
    versions of a kernel side by side in one process."""
    from torch.utils.cpp_extension import load as build

    return build(name=tree_module_name(csrc, extra_cflags), sources=[str(csrc / s.name) for s in SOURCES],
                 extra_cflags=[*CFLAGS, *extra_cflags], extra_ldflags=list(LDFLAGS), verbose=False)


STALE_LOCK_S = 600.0
"""A build lock older than this was left by a build that died (a build takes about two
minutes on our 2-core machines)."""


def wait_for_build_lock(build_dir: Path, stale_s: float = STALE_LOCK_S, poll_s: float = 1.0) -> None:
    """Return once no build holds ``build_dir``'s lock. torch's own wait for that lock has
    no deadline, and a build killed midway (a worker stopped during its first start)
    leaves the lock behind: every later start would hang. A lock is waited for until it
    is ``stale_s`` old, then removed with a warning (no build takes that long), so this
    returns within ``stale_s``."""
    lock = build_dir / "lock"
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > stale_s:
            log.warning("removing %s, left %.0f s ago by a kernel build that did not finish", lock, age)
            lock.unlink(missing_ok=True)
            return
        time.sleep(poll_s)


@functools.cache
def load() -> ModuleType:
    """The compiled module; raises ``KernelsUnavailableError`` saying why it is not."""
    from torch.utils.cpp_extension import _get_build_directory
    from torch.utils.cpp_extension import load as build

    name = module_name(cpu_flags())
    wait_for_build_lock(Path(_get_build_directory(name, verbose=False)))
    try:
        module = build(name=name, sources=[str(s) for s in SOURCES],
                       extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
                       verbose=False)
    except Exception as exc:  # compiler, ninja or headers missing: say which
        raise KernelsUnavailableError(f"the CPU kernels could not be built: {exc}") from exc
    log.info("loaded CPU kernels %s", name)
    return module
