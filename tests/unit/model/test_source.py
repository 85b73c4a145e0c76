"""Model sources: a folder, or a hub id resolved through a Hugging Face cache (offline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdmesh.errors import UnsupportedModelError
from pdmesh.model.source import display_name, identity_name, resolve_model
from tests.hub_cache import COMMIT, add_to_hub_cache


def _resolve_in_subprocess(spec: str, cache: Path, offline: bool = True) -> tuple[int, str]:
    """``resolve_model`` in a fresh process: ``huggingface_hub`` reads its variables at import."""
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1" if offline else "0"}
    code = ("import sys\nfrom pdmesh.model.source import resolve_model\n"
            "from pdmesh.errors import PdmeshError\n"
            "try:\n    s = resolve_model(sys.argv[1]); print(s.path, s.name)\n"
            "except PdmeshError as e:\n    print(e); sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", code, spec], env=env, capture_output=True, text=True,
                          timeout=60)
    return done.returncode, (done.stdout + done.stderr).strip()


@pytest.fixture(scope="module")
def cache(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf-cache")
    add_to_hub_cache(root, "acme/tiny-llama", llama_dir)
    return root


def test_a_folder_is_itself(llama_dir: Path) -> None:
    source = resolve_model(str(llama_dir))
    assert source.path == llama_dir and source.name == llama_dir.name


def test_a_missing_folder_and_a_folder_without_config_differ(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="no such folder"):
        resolve_model(str(tmp_path / "nonexistent"))
    with pytest.raises(UnsupportedModelError, match="no such folder"):
        resolve_model("/nonexistent")
    with pytest.raises(UnsupportedModelError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_hub_id_from_the_cache_offline(cache: Path) -> None:
    snapshot = cache / "models--acme--tiny-llama" / "snapshots" / COMMIT
    for spec in ("acme/tiny-llama", f"acme/tiny-llama@{COMMIT}"):
        rc, out = _resolve_in_subprocess(spec, cache)
        assert rc == 0, out
        assert out == f"{snapshot} {spec}"


def test_hub_id_not_in_the_cache_says_where_it_looked(cache: Path) -> None:
    rc, out = _resolve_in_subprocess("acme/other-model", cache)
    assert rc == 3, out
    assert "acme/other-model is not in the Hugging Face cache" in out and str(cache) in out
    assert "HF_HUB_OFFLINE is set" in out and "Traceback" not in out
    rc, out = _resolve_in_subprocess("acme/tiny-llama@v9", cache)
    assert rc == 3 and "at revision 'v9'" in out, out


def test_hub_id_without_a_network_falls_back_to_the_cache(cache: Path) -> None:
    """Not offline, and the hub unreachable (our machines): the cached snapshot serves."""
    rc, out = _resolve_in_subprocess("acme/tiny-llama", cache, offline=False)
    assert rc == 0, out
    rc, out = _resolve_in_subprocess("acme/not-here", cache, offline=False)
    assert rc == 3 and "cannot be reached" in out, out


def test_identity_of_a_snapshot_is_its_repository_and_commit(cache: Path, tmp_path: Path) -> None:
    snapshot = cache / "models--acme--tiny-llama" / "snapshots" / COMMIT
    assert identity_name(snapshot) == f"acme/tiny-llama@{COMMIT}"
    assert display_name(snapshot) == "acme/tiny-llama"
    (tmp_path / "my-model").mkdir()
    assert identity_name(tmp_path / "my-model") == display_name(tmp_path / "my-model") == "my-model"


def test_snapshot_config_is_the_folders(cache: Path, llama_dir: Path) -> None:
    snapshot = cache / "models--acme--tiny-llama" / "snapshots" / COMMIT
    assert json.loads((snapshot / "config.json").read_text()) == json.loads((llama_dir / "config.json").read_text())
