"""Compile a C++ extension with torch's cpp_extension, once per machine for given sources.

Three things torch's ``load`` does not do for a service that must start on time:
- **The same sources build once, wherever they live.** torch writes the sources' absolute
  paths into its ``build.ninja``, so two checkouts (or a checkout and a pip install) of one
  commit rebuilt the shared cache each time the other ran: ~3 minutes on two cores. The
  sources are copied into the build folder first (``src/``, written only where their bytes
  differ, so ninja sees the same files and times), and torch builds those copies: every
  copy of the same sources names the same files.
- **One build at a time, none waiting on a dead one** (``build_lock.py``).
- **A launcher sees the build.** While this process compiles, or waits for another's
  compile, ``BuildMark`` shows it and the start-up phase says so (``pdmesh/startup.py``),
  so the launcher gives it the build's time rather than a start deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from pdmesh.attention.build_lock import BuildMark, build_lock
from pdmesh.startup import set_phase

log = logging.getLogger(__name__)
STAGED = "src"
"""The build folder's copy of the sources."""


def torch_identity() -> bytes:
    """The torch a build compiles against, for the build's name: its version and where it is
    installed. torch writes its include and library folders into the build's compile lines,
    so two virtual environments (a checkout's and a fresh clone's) sharing one build folder
    each found the other's command lines in ninja's log and rebuilt everything (~3 minutes on
    two cores) while the build looked cached, and a launcher gave the start no build time."""
    import torch

    return f"{torch.__version__}|{Path(torch.__file__).resolve().parent}".encode()


def stage_sources(build_dir: Path, files: Sequence[Path]) -> list[Path]:
    """``files`` copied into ``build_dir/src`` (flat: headers beside the sources that
    include them); a file whose copy already holds its bytes is left untouched."""
    staged_dir = build_dir / STAGED
    staged_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for src in files:
        dest = staged_dir / src.name
        data = src.read_bytes()
        if not (dest.is_file() and dest.read_bytes() == data):
            tmp = dest.with_suffix(dest.suffix + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(dest)
        out.append(dest)
    return out


def build_extension(name: str, sources: Sequence[Path], headers: Sequence[Path], cflags: Sequence[str],
                    ldflags: Sequence[str] = ()) -> ModuleType:
    """torch's build of ``sources`` (which include ``headers``) as module ``name``: ``name``
    must change whenever the sources' bytes or the flags do (callers digest them into it)."""
    from torch.utils.cpp_extension import _get_build_directory
    from torch.utils.cpp_extension import load as build

    build_dir = Path(_get_build_directory(name, verbose=False))
    mark = BuildMark()
    building = not (build_dir / f"{name}.so").exists()
    if building:
        log.info("building C++ extension %s (once per machine for these sources: minutes on two cores)", name)
        set_phase(f"building pdmesh's CPU kernels {name} (once per machine, minutes on two cores)")
        mark.show()

    def waiting(holder: str) -> None:
        set_phase(f"waiting for process {holder}'s build of {name}")
        mark.show()

    with mark, build_lock(build_dir, on_wait=waiting):
        staged = stage_sources(build_dir, [*sources, *headers])
        return build(name=name, sources=[str(s) for s in staged[:len(sources)]], extra_cflags=list(cflags),
                     extra_ldflags=list(ldflags), verbose=False)
