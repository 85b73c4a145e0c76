"""The same sources in two checkouts build once: the second loads the first's build.

torch records its sources' absolute paths in ``build.ninja``; before the sources were
staged into the build folder, a second checkout's paths changed that file and ninja
compiled everything again (minutes on two cores for pdmesh's kernels, every time the
other checkout had run in between). A tiny pybind11 module stands in for the kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pdmesh.attention.extension_build import STAGED, stage_sources

SOURCE = '#include <pybind11/pybind11.h>\n#include "probe.h"\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", [] { return ANSWER; }); }\n'
HEADER = "#define ANSWER 42\n"
BUILD = """
import sys
from pathlib import Path
from pdmesh.attention.extension_build import build_extension
tree = Path(sys.argv[1])
module = build_extension("pdmesh_probe_ext", [tree / "probe.cpp"], [tree / "probe.h"], ["-O1"])
print(module.answer())
"""


def _checkout(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "probe.cpp").write_text(SOURCE)
    (root / "probe.h").write_text(HEADER)
    return root


def _build(tree: Path, extensions: Path) -> str:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)}
    done = subprocess.run([sys.executable, "-c", BUILD, str(tree)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_a_second_checkout_loads_the_first_checkouts_build_without_compiling(tmp_path: Path) -> None:
    extensions = tmp_path / "torch_extensions"
    first, second = _checkout(tmp_path / "checkout-a"), _checkout(tmp_path / "checkout-b")
    assert _build(first, extensions) == "42"
    (build_dir,) = [p for p in extensions.rglob("pdmesh_probe_ext") if p.is_dir()]
    library = build_dir / "pdmesh_probe_ext.so"
    built, steps = library.stat().st_mtime_ns, (build_dir / ".ninja_log").read_text().count("\n")
    assert _build(second, extensions) == "42"
    assert library.stat().st_mtime_ns == built, "the second checkout compiled again"
    assert (build_dir / ".ninja_log").read_text().count("\n") == steps, "ninja ran a build step"
    assert str(first) not in (build_dir / "build.ninja").read_text()


def test_staging_writes_a_copy_only_where_its_bytes_differ(tmp_path: Path) -> None:
    tree = _checkout(tmp_path / "tree")
    (copy,) = stage_sources(tmp_path / "build", [tree / "probe.h"])
    assert copy == tmp_path / "build" / STAGED / "probe.h" and copy.read_text() == HEADER
    before = copy.stat().st_mtime_ns
    stage_sources(tmp_path / "build", [tree / "probe.h"])
    assert copy.stat().st_mtime_ns == before  # ninja would rebuild on a newer copy
    (tree / "probe.h").write_text("#define ANSWER 43\n")
    stage_sources(tmp_path / "build", [tree / "probe.h"])
    assert copy.read_text() == "#define ANSWER 43\n"
