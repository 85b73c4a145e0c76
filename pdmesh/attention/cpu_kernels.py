"""Build (once per machine) and load pdmesh's C++ CPU kernels (``csrc/``).

They are compiled with torch's cpp_extension on first use and cached in torch's extension
folder (``extension_build.py``: from a copy of the sources in that folder, so another checkout
of the same sources loads the same build). The module name carries a digest of the sources, the torch
install (``torch_identity``) and this CPU's instruction-set flags: the kernels are built with
``-march=native``, and a cache built on an AVX-512 machine must never be loaded on an AVX2-only one.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path
from types import ModuleType

from pdmesh.attention.extension_build import build_extension, torch_identity
from pdmesh.cpu import cpu_flags
from pdmesh.errors import PdmeshError

log = logging.getLogger(__name__)
SOURCES = tuple(Path(__file__).parent / "csrc" / f
                for f in ("module.cpp", "paged_attention.cpp", "paged_prefill.cpp", "elementwise.cpp",
                          "linear_rows.cpp", "kv_write.cpp", "moe_rows.cpp"))
HEADERS = tuple(Path(__file__).parent / "csrc" / f for f in ("vec_math.h", "shared_rows.h", "row_tiles.h"))
CFLAGS = ("-O3", "-march=native", "-fopenmp")
"""How the kernels are compiled (``scripts/probes/linear/linear_rows_avx2.py`` adds ``-mno-avx512f``)."""
LDFLAGS = ("-fopenmp",)


class KernelsUnavailableError(PdmeshError):
    """The C++ kernels could not be built or loaded here (no compiler, no ninja ...)."""


def module_name(flags: str) -> str:
    """The cached build's name for these CPU flags (and these sources, this torch)."""
    digest = hashlib.sha256()
    for src in SOURCES + HEADERS:
        digest.update(src.read_bytes())
    digest.update(torch_identity())
    digest.update(flags.encode())
    return f"pdmesh_cpu_kernels_{digest.hexdigest()[:12]}"


def tree_module_name(csrc: Path, extra_cflags: tuple[str, ...] = ()) -> str:
    """The cached build's name for another checkout's kernels (its ``pdmesh/attention/csrc``)
    built with ``extra_cflags``: a digest of every file there (sources, headers) and the flags,
    so two trees that differ in a header alone never share a build."""
    digest = hashlib.sha256(" ".join(extra_cflags).encode())
    for path in sorted(p for p in csrc.iterdir() if p.is_file()):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(torch_identity())
    return f"pdmesh_tree_kernels_{digest.hexdigest()[:12]}"


def build_tree(csrc: Path, extra_cflags: tuple[str, ...] = ()) -> ModuleType:
    """Another checkout's kernels, built as ``load`` builds these plus ``extra_cflags``
    (``-mno-avx512f``: the code an AVX2-only machine runs): for scripts that time two
    versions of a kernel side by side in one process."""
    return build_extension(tree_module_name(csrc, extra_cflags), [csrc / s.name for s in SOURCES],
                           sorted(p for p in csrc.iterdir() if p.suffix == ".h"), (*CFLAGS, *extra_cflags), LDFLAGS)


@functools.cache
def load() -> ModuleType:
    """The compiled module; raises ``KernelsUnavailableError`` saying why it is not."""
    name = module_name(cpu_flags())
    try:
        module = build_extension(name, SOURCES, HEADERS, CFLAGS, LDFLAGS)
    except Exception as exc:  # compiler, ninja or headers missing: say which
        raise KernelsUnavailableError(f"the CPU kernels could not be built: {exc}") from exc
    log.info("loaded CPU kernels %s", name)
    return module
