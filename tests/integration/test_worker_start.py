"""A starting worker: its port is open and its health NOT_SERVING from the start, calls to
its services are refused UNAVAILABLE naming what it is doing, reflection answers, and it
serves once its engine is in. The engine is held at one step of its start by holding the
machine's measurement lock (in a private temporary folder), as another process's
measurement would hold it."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from pdmesh.launcher import Mesh, MeshSpec, Proc
from pdmesh.measure_lock import LOCK_FILE, STATE_DIR_ENV
from pdmesh.rpc.health import health_status
from pdmesh.startup import PHASE_FILE_ENV
from pdmesh.v1 import worker_pb2, worker_pb2_grpc


def _wait(what: str, check, timeout: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_loading_worker_answers_health_and_refuses_calls_with_its_phase(llama_dir: Path, tmp_path: Path) -> None:
    lock = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)  # the worker's linear-plan measurement waits for this
    port_file, log = tmp_path / "decode.port", tmp_path / "decode.log"
    env = {**os.environ, STATE_DIR_ENV: str(tmp_path), PHASE_FILE_ENV: str(tmp_path / "decode.phase")}
    proc = subprocess.Popen([sys.executable, "-m", "pdmesh", "decode", "--model", str(llama_dir), "--dtype",
                             "float32", "--num-blocks", "64", "--port", "0", "--port-file", str(port_file)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    try:
        address = "127.0.0.1:" + _wait("the port file", lambda: port_file.is_file() and port_file.read_text())
        _wait("the measurement phase", lambda: "measuring the linear plan" in (
            (tmp_path / "decode.phase").read_text() if (tmp_path / "decode.phase").is_file() else ""))
        assert health_status(address) == "NOT_SERVING"
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                worker_pb2_grpc.WorkerStub(channel).Info(worker_pb2.InfoRequest(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "this worker is starting (measuring the linear plan" in refused.value.details()
            from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
                ProtoReflectionDescriptorDatabase,
            )

            assert "pdmesh.v1.Decode" in set(ProtoReflectionDescriptorDatabase(channel).get_services())
        fcntl.flock(lock, fcntl.LOCK_UN)
        _wait("SERVING", lambda: health_status(address) == "SERVING")
        with grpc.insecure_channel(address) as channel:
            info = worker_pb2_grpc.WorkerStub(channel).Info(worker_pb2.InfoRequest(), timeout=10)
        assert info.num_blocks == 64 and info.device == "cpu"
        assert (tmp_path / "decode.phase").read_text() == "serving"
        text = log.read_text()
        assert "start-up: loading weights 1/1 shards" in text and "start-up: warming up" in text
        assert "serving " in text and "64 KV blocks of 16 tokens" in text  # the start-up summary
    finally:
        os.close(lock)
        proc.kill()
        proc.wait(30)


def test_the_launcher_shows_each_starting_process_phase_and_names_the_last_when_it_gives_up(tmp_path: Path) -> None:
    shown: list[str] = []
    mesh = Mesh(MeshSpec(model="m", log_dir=str(tmp_path), start_timeout_s=1.5), progress=shown.append)
    code = ("import time\nfrom pdmesh.startup import set_phase\nset_phase('loading weights 1/2 shards')\n"
            "time.sleep(60)")
    popen = subprocess.Popen([sys.executable, "-c", code],
                             env={**os.environ, PHASE_FILE_ENV: str(mesh.watch.phase_file("prefill-0"))})
    try:
        _wait("the phase", lambda: mesh.watch.phase_file("prefill-0").is_file())
        with pytest.raises(RuntimeError, match="not ready after 1.5s, last phase: loading weights 1/2 shards"):
            mesh.await_ready(Proc("prefill-0", popen))
    finally:
        popen.kill()
        popen.wait(10)
    assert len(shown) == 1 and shown[0].startswith("prefill-0: loading weights 1/2 shards (")
