"""Shared fixtures: tiny seeded models (made once per session) and their HF references."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.oracle import ARCHS, HFReference

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_STATE_DIR = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """A run of its own: the machine-wide plan store and measurement lock in a folder of this
    run (a plan another process measured minutes ago would change which code a test runs),
    and nothing of Hypothesis's in the checkout: no example database (examples replay from
    the seed), its caches under ``.cache/``."""
    import tempfile

    from hypothesis import settings
    from hypothesis.configuration import set_hypothesis_home_dir

    from pdmesh.measure_lock import STATE_DIR_ENV

    state = tempfile.mkdtemp(prefix="pdmesh-test-state-")
    config.stash[_STATE_DIR] = state
    os.environ[STATE_DIR_ENV] = state  # the services the tests start inherit it
    set_hypothesis_home_dir(str(config.rootpath / ".cache" / "hypothesis"))
    settings.register_profile("pdmesh", database=None)
    settings.load_profile("pdmesh")


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    if (state := config.stash.get(_STATE_DIR, None)) is not None:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from pdmesh.tools.make_tiny import make_tiny

    root = tmp_path_factory.mktemp("models")
    return {arch: make_tiny(root / arch, arch, "tiny", seed=0) for arch in ARCHS}


@pytest.fixture(scope="session")
def llama_dir(model_dirs: dict[str, Path]) -> Path:
    return model_dirs["llama"]


@pytest.fixture(scope="session")
def hf_refs(model_dirs: dict[str, Path]) -> dict[str, HFReference]:
    return {arch: HFReference(path) for arch, path in model_dirs.items()}
