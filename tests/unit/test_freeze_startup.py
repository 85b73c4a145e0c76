"""Services freeze their start-up objects: full collections under load then walk only
what requests allocated (docs/performance/log.md, section 16)."""

from __future__ import annotations

import subprocess
import sys


def test_freezing_leaves_the_collector_only_what_is_allocated_afterwards() -> None:
    # In a child process: freezing the test runner's own objects would keep them forever.
    code = (
        "import gc, torch\n"
        "from pdmesh.rpc.process import freeze_startup_objects\n"
        "before = len(gc.get_objects())\n"
        "frozen = freeze_startup_objects()\n"
        "after = len(gc.get_objects())\n"
        "later = [[i] for i in range(1000)]\n"
        "print(before, frozen, after, len(gc.get_objects()) - after)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, frozen, after, added = map(int, out.stdout.split())
    assert before > 50_000 and frozen >= before // 2  # torch alone is most of a service's heap
    assert after < before // 20  # the collector no longer walks them
    assert added >= 1000  # objects made later are tracked (and collected) as before
