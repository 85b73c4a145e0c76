import subprocess
import sys
from pathlib import Path

import pytest

from pdmesh.errors import InvalidRequestError
from pdmesh.service_config import load_config
from services.router.config import RouterConfig
from services.worker.config import WorkerConfig


def test_yaml_then_env_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text("model: /m\nblock-size: 8\nnum_blocks: 100\nrole: prefill\n")
    env = {"PDMESH_WORKER_NUM_BLOCKS": "200", "PDMESH_WORKER_LEASE_MS": "500"}
    cfg = load_config(WorkerConfig, f, "PDMESH_WORKER_", {"lease_ms": "700", "threads": None}, env)
    assert (cfg.block_size, cfg.num_blocks, cfg.lease_ms, cfg.role) == (8, 200, 700, "prefill")


def test_lists_literals_and_unknown_options(tmp_path: Path) -> None:
    cfg = load_config(RouterConfig, None, None, {"model": "/m", "prefill": "a:1, b:2"})
    assert cfg.prefill == ("a:1", "b:2")
    with pytest.raises(InvalidRequestError, match="prefill_policy"):
        load_config(RouterConfig, None, None, {"model": "/m", "prefill_policy": "random"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: /m\nblok_size: 8\n")
    with pytest.raises(InvalidRequestError, match="blok_size: unknown option"):
        load_config(WorkerConfig, bad)
    with pytest.raises(InvalidRequestError, match="block_size: expected int"):
        load_config(WorkerConfig, None, None, {"model": "/m", "block_size": "sixteen"})


def test_generated_protos_match_the_contract(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(root / "protos"),
         f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}",
         *map(str, sorted((root / "protos/pdmesh/v1").glob("*.proto")))],
        check=True,
    )
    for generated in sorted((tmp_path / "pdmesh/v1").iterdir()):
        committed = root / "pdmesh/v1" / generated.name
        assert committed.read_text() == generated.read_text(), f"{generated.name}: run scripts/gen_protos.sh"
