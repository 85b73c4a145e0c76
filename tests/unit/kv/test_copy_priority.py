"""KV copies at real-time priority: only for the call, the thread put back as it was, and a
process that may not raise a thread told why (real scheduler calls, real NIXL)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading

import pytest
import torch

from pdmesh.kv.transfer.base import KVRegion, PeerLayout
from pdmesh.kv.transfer.copy_priority import copy_priority, realtime_refusal
from pdmesh.kv.transfer.nixl import NixlTransport
from pdmesh.kv.transfer.runner import TransferRunner

needs_realtime = pytest.mark.skipif(
    bool(realtime_refusal()), reason=f"this process may not use SCHED_FIFO: {realtime_refusal()}")


def _on_thread(fn):  # type: ignore[no-untyped-def]
    """Run ``fn`` on a thread of its own, so the test's own thread is never changed."""
    out: dict[str, object] = {}

    def body() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            out["error"] = exc

    t = threading.Thread(target=body)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the thread did not finish within 30 s"
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]


def test_normal_leaves_the_thread_alone() -> None:
    prio = copy_priority("normal")
    assert not prio.realtime
    assert _on_thread(lambda: prio.call(os.sched_getscheduler, 0)) == os.SCHED_OTHER


@needs_realtime
def test_realtime_only_while_the_call_runs_then_the_thread_as_it_was() -> None:
    prio = copy_priority("realtime")
    assert prio.realtime, prio.detail

    def body() -> tuple[int, int, int, int]:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, 3)  # a niced thread (per thread on Linux)
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        during = prio.call(os.sched_getscheduler, 0)
        return during, os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, tid), prio.call(lambda: 7)

    during, after, nice, value = _on_thread(body)
    assert during == os.SCHED_FIFO
    assert after == os.SCHED_BATCH and nice == 3
    assert value == 7


@needs_realtime
def test_the_thread_is_put_back_when_the_call_raises() -> None:
    prio = copy_priority("realtime")

    def body() -> int:
        def fail() -> None:
            raise RuntimeError("copy failed")

        with pytest.raises(RuntimeError):
            prio.call(fail)
        return os.sched_getscheduler(0)

    assert _on_thread(body) == os.SCHED_OTHER


@needs_realtime
def test_a_write_starts_and_is_first_polled_at_realtime_priority() -> None:
    """What runs raised is the agent's own ``transfer`` (which copies between processes on
    one host) and the first poll, observed from inside them; the event loop's thread is
    back to normal after, and the blocks land."""
    blocks, floats = 4, 16 * 1024
    src_pool, dst_pool = torch.randn(blocks, floats), torch.zeros(blocks, floats)
    src = NixlTransport("prio-src", KVRegion.of_tensor(src_pool))
    dst = NixlTransport("prio-dst", KVRegion.of_tensor(dst_pool))
    seen: list[tuple[str, int]] = []
    transfer, check = src.agent.transfer, src.agent.check_xfer_state

    def observed(name, fn):  # type: ignore[no-untyped-def]
        def call(handle):  # type: ignore[no-untyped-def]
            seen.append((name, os.sched_getscheduler(0)))
            return fn(handle)
        return call

    src.agent.transfer = observed("transfer", transfer)
    src.agent.check_xfer_state = observed("poll", check)

    async def go() -> int:
        receiver = TransferRunner(dst)
        receiver.poller.drive_progress(lambda: True)
        runner = TransferRunner(src, copy_priority("realtime"))
        try:
            await runner.write("prio-dst", [0, 1], [2, 3], timeout=10)
        finally:
            runner.poller.close()
            receiver.poller.close()
        return os.sched_getscheduler(0)

    try:
        src.add_peer(PeerLayout("prio-dst", dst.metadata(), dst.base_addr, dst.block_bytes, blocks))
        assert _on_thread(lambda: asyncio.run(go())) == os.SCHED_OTHER
    finally:
        src.close()
        dst.close()
    assert seen[:2] == [("transfer", os.SCHED_FIFO), ("poll", os.SCHED_FIFO)]
    assert all(policy == os.SCHED_OTHER for _, policy in seen[2:])  # the poller thread's polls
    assert torch.equal(dst_pool[2:4], src_pool[0:2])


def _without_realtime() -> list[str]:
    """A command prefix under which a process may not raise a thread: root keeps
    CAP_SYS_NICE unless it is dropped, so drop it (setpriv); the RLIMIT_RTPRIO of 0 is set
    by the child itself."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: cannot start a process without CAP_SYS_NICE")
    return ["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice", "--"]


def test_a_process_that_may_not_raise_a_thread_says_why() -> None:
    code = ("import resource; resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0)); "
            "from pdmesh.kv.transfer.copy_priority import copy_priority; "
            "p = copy_priority('realtime'); print(p.realtime); print(p.detail)")
    out = subprocess.run([*_without_realtime(), sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    assert out[0] == "False"
    assert "CAP_SYS_NICE" in out[1] and "ulimit -r 1" in out[1]
