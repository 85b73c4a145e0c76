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
from pathlib import Path
from types import ModuleType

import torch

from pdmesh.cpu import cpu_flags
from pdmesh.errors import PdmeshError

log = logging.getLogger(__name__)
SOURCES = tuple(Path(__file__).parent / "csrc" / f for f in ("module.cpp", "paged_attention.cpp", "elementwise.cpp"))


class KernelsUnavailableError(PdmeshError):
    """The C++ kernels could not be built or loaded here (no compiler, no ninja ...)."""


def module_name(flags: str) -> str:
    """The cached build's name for these CPU flags (and these sources, this torch)."""
    digest = hashlib.sha256()
    for src in SOURCES:
        digest.update(src.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(flags.encode())
    return f"pdmesh_cpu_kernels_{digest.hexdigest()[:12]}"


@functools.cache
def load() -> ModuleType:
    """The compiled module; raises ``KernelsUnavailableError`` saying why it is not."""
    from torch.utils.cpp_extension import load as build

    name = module_name(cpu_flags())
    try:
        module = build(name=name, sources=[str(s) for s in SOURCES],
                       extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                       verbose=False)
    except Exception as exc:  # compiler, ninja or headers missing: say which
        raise KernelsUnavailableError(f"the CPU kernels could not be built: {exc}") from exc
    log.info("loaded CPU kernels %s", name)
    return module
