"""Every probe under ``scripts/probes/`` still imports and answers ``--help``.

The probes measure one question each and are rerun when their topic is worked on again
(each page of docs/ says which); nothing else imports them, so one that a refactor broke
used to go unnoticed until someone needed it. Each is run here as ``python PROBE --help``
runs it (as ``__main__``, its folder first on the path for its siblings' imports), in this
process: its imports resolve, and it parses its command line before doing any work.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PROBES = Path(__file__).resolve().parents[2] / "scripts" / "probes"
ALL = sorted(PROBES.glob("*/*.py"))


def test_the_probes_are_where_their_topics_are() -> None:
    assert len(ALL) >= 30, ALL
    assert not sorted(PROBES.parent.glob("*.py")) or {p.name for p in PROBES.parent.glob("*.py")} == {
        "render_chart.py"}, "a probe belongs under scripts/probes/<topic>/"


@contextlib.contextmanager
def _as_main(path: Path) -> Iterator[io.StringIO]:
    out = io.StringIO()
    argv, sys_path, modules = sys.argv, list(sys.path), set(sys.modules)
    sys.argv, sys.path[:0] = [str(path), "--help"], [str(path.parent)]
    try:
        with contextlib.redirect_stdout(out):
            yield out
    finally:
        sys.argv, sys.path[:] = argv, sys_path
        for name in set(sys.modules) - modules:  # a sibling probe imported by name
            if getattr(sys.modules[name], "__file__", "") and str(PROBES) in str(sys.modules[name].__file__):
                del sys.modules[name]


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_probe_imports_and_answers_help(path: Path) -> None:
    with _as_main(path) as out, pytest.raises(SystemExit) as ended:
        runpy.run_path(str(path), run_name="__main__")
    assert ended.value.code in (0, None), f"{path.name} --help exited {ended.value.code}"
    first_line = path.read_text().split('"""')[1].strip().splitlines()[0]
    assert first_line[:40] in out.getvalue(), f"{path.name} --help should show its docstring"
