"""What ``pdmesh up`` and every service refuse before they start serving: one line naming
the option, exit status 2, no traceback and no process left behind."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from pdmesh.cli import main
from pdmesh.config import EngineArgs, MeshContract
from pdmesh.errors import BindError, InvalidRequestError
from pdmesh.rpc.server import create_server


@pytest.mark.parametrize(("flags", "needle"), [
    (["--prefill", "-1"], "prefill: must be 0 or more workers, got -1"),
    (["--decode", "-2"], "decode: must be 0 or more workers, got -2"),
    (["--block-size", "0"], "block_size: must be >= 1, got 0"),  # was a ZeroDivisionError in the kvstore
    (["--num-blocks", "-5"], "num_blocks: must be >= 0, got -5"),
    (["--max-num-seqs", "0"], "max_num_seqs: must be >= 1, got 0"),
    (["--kv-cache-memory-gb", "0"], "kv_cache_memory_gb: must be > 0, got 0"),
    (["--dtype", "float8"], "dtype: must be one of"),
])
def test_up_refuses_an_option_out_of_range_before_starting_anything(
        llama_dir: Path, capsys: pytest.CaptureFixture[str], flags: list[str], needle: str) -> None:
    assert main(["up", "--model", str(llama_dir), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pdmesh: error: ") and needle in err and "Traceback" not in err


def test_up_refuses_a_folder_that_is_not_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--model", str(tmp_path)]) == 2
    assert "no config.json (is this a Hugging Face model folder?)" in capsys.readouterr().err


def test_every_service_config_checks_its_engine_options() -> None:
    with pytest.raises(InvalidRequestError, match="block_size: must be >= 1"):
        MeshContract(model="m", block_size=0)
    with pytest.raises(InvalidRequestError, match="max_num_batched_tokens: must be >= 1"):
        EngineArgs(model="m", max_num_batched_tokens=0)
    EngineArgs(model="m", num_blocks=0, threads=0, max_model_len=0)  # 0: "size it / the default"


def test_a_taken_port_is_a_bind_error_naming_the_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"

        async def bind() -> None:
            create_server(address, [])

        with pytest.raises(BindError, match=f"cannot listen on {address}: the port is taken"):
            asyncio.run(bind())
