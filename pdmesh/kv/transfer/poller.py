"""Drive NIXL transfers from a thread of their own, not the event loop.

UCX moves a transfer only when its owner polls (the NIXL progress thread is off: it spins
a whole core), and over some transports also only while the target progresses. Polled
from the event loop, a worker under load checked a transfer only when its loop came
round, between gRPC messages of every other request: in ``pdmesh bench mesh`` a prefill
worker's 4 MiB writes took 17 ms each under load against 2.4 ms for raw NIXL (0.13x). This
thread polls every in-flight handle every ``busy_interval_s``, and on a transfer target (a
decode worker) drives progress every ``await_interval_s`` while a reservation awaits its
KV (every ``idle_interval_s`` otherwise); results go back to the loop with
``call_soon_threadsafe``. Waiting releases the GIL, so a pass costs the engine thread
only the few microseconds it takes.

Every call into the transport is serialised by the transport's own lock (NIXL agents are
created without thread synchronisation); the poller's ``_mutex`` only guards its tables,
so ``forget`` never returns while a pass is polling the handle it forgets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pdmesh.kv.transfer.base import KVTransport, TransferState
from pdmesh.telemetry.thread_name import name_os_thread

log = logging.getLogger(__name__)
BUSY_INTERVAL_S = 0.0001
"""Between passes while a transfer this worker started is in flight (it is short)."""
AWAIT_INTERVAL_S = 0.002
"""Between progress passes while a reservation awaits its KV, i.e. for a whole prefill on
another worker: at 0.1 ms these wake-ups took cores from that very prefill (on 2 cores a
lone 256-token prompt prefilled 20-25 ms slower, ~12%, than with 2 ms; docs/performance/log.md
section 11). Over shared memory (UCX's ``cma``) a write needs no pass on the target at all;
over TCP each of its parts waits for one: a decode worker whose writes have lately all
landed within their writers' calls awaits KV without these passes
(``services/decode/write_path.py``)."""
IDLE_INTERVAL_S = 0.05
"""Between progress passes with nothing awaited: writes into this worker's pool whose
reservation lapsed must still complete, so passes never stop on a target. A new
reservation pokes the poller onto the await rate at once (``poke``), so this interval
delays only such lapsed writes; at 5 ms an idle decode worker woke 200 times a second,
and every mesh process's wake-ups slow the others' prefill on a small machine
(docs/performance/log.md section 14)."""


@dataclass(slots=True)
class _Watch:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[tuple[TransferState, float]]
    what: str


class TransferPoller:
    def __init__(self, transport: KVTransport, busy_interval_s: float = BUSY_INTERVAL_S,
                 await_interval_s: float = AWAIT_INTERVAL_S, idle_interval_s: float = IDLE_INTERVAL_S) -> None:
        self.transport = transport
        self.busy_interval_s = busy_interval_s
        self.await_interval_s = await_interval_s
        self.idle_interval_s = idle_interval_s
        self._watches: dict[int, tuple[object, _Watch]] = {}
        self._awaiting: Callable[[], bool] | None = None
        """Set on a transfer target: read from this thread, whether a reservation awaits
        its KV (progress at the await rate)."""
        self._mutex = threading.Lock()
        self._wake = threading.Condition(self._mutex)
        self._closed = False
        self._thread: threading.Thread | None = None

    def watch(self, handle: object, what: str) -> asyncio.Future[tuple[TransferState, float]]:
        """A future for the running loop: ``(DONE or FAILED, perf_counter when seen)``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[TransferState, float]] = loop.create_future()
        with self._wake:
            self._ensure_thread()
            self._watches[id(handle)] = (handle, _Watch(loop, future, what))
            self._wake.notify()
        return future

    def forget(self, handle: object) -> None:
        """Stop polling ``handle`` (before releasing it); waits out a pass in progress."""
        with self._mutex:
            self._watches.pop(id(handle), None)

    @property
    def watching(self) -> int:
        """Transfers polled now (0 once every one was seen done or forgotten)."""
        with self._mutex:
            return len(self._watches)

    def drive_progress(self, awaiting: Callable[[], bool]) -> None:
        """Make progress for peers' transfers into this pool from now on, at the await rate
        while ``awaiting()`` (read from this thread, so it must be safe there)."""
        with self._wake:
            self._ensure_thread()
            self._awaiting = awaiting
            self._wake.notify()

    def poke(self) -> None:
        """Poll now and re-read the rate: a reservation now awaits its KV."""
        with self._wake:
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- the thread -------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="nixl-poller", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        name_os_thread("nixl-poller")
        while True:
            try:
                with self._wake:
                    while not self._watches and self._awaiting is None and not self._closed:
                        self._wake.wait()
                    if self._closed:
                        return
                    transferring = self._poll_transfers()
                    awaiting_fn = self._awaiting
                awaiting = awaiting_fn is not None and self._progress(awaiting_fn)
            except Exception:  # the thread must outlive any one pass: every transfer needs it
                log.exception("NIXL poller pass failed")
                transferring = awaiting = False
            with self._wake:  # a wait, not a sleep: ``watch`` and ``poke`` cut it short
                if not self._closed:
                    self._wake.wait(self.busy_interval_s if transferring
                                    else self.await_interval_s if awaiting else self.idle_interval_s)

    def _poll_transfers(self) -> bool:
        """One pass over the watched handles (called holding ``_mutex``); returns whether
        any is still in flight."""
        for key, (handle, w) in list(self._watches.items()):
            state = poll_state(self.transport, handle, w.what)
            if state is not TransferState.PENDING:
                del self._watches[key]
                _post(w.loop, _settle, w.future, (state, time.perf_counter()))
        return bool(self._watches)

    def _progress(self, awaiting: Callable[[], bool]) -> bool:
        try:
            self.transport.progress()
        except Exception as exc:  # noqa: BLE001 - a transport error must not end the thread
            log.warning("NIXL progress failed: %s", exc)
            return False
        return awaiting()


def poll_state(transport: KVTransport, handle: object, what: str) -> TransferState:
    """A transfer's state; FAILED when polling itself raises (a peer that died mid-transfer)."""
    try:
        return transport.poll(handle)
    except Exception as exc:  # noqa: BLE001 - a poll that raises is a failed transfer
        log.warning("KV %s failed while polling: %s", what, exc)
        return TransferState.FAILED


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: object) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed (the process is shutting down): nobody waits
        loop.call_soon_threadsafe(fn, *args)


def _settle(future: asyncio.Future[tuple[TransferState, float]], result: tuple[TransferState, float]) -> None:
    if not future.done():  # the waiter may have timed out and gone
        future.set_result(result)
