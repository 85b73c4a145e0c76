"""``AsyncLLMEngine``: many concurrent ``generate`` streams over one engine loop.

Adds and aborts from coroutines are queued and applied between steps by the loop task,
which runs each ``step()`` on a worker thread (torch releases the GIL), so the event loop
stays responsive while the model runs. Closing a ``generate`` iterator (client gone,
task cancelled) aborts the request and frees its blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.errors import InvalidRequestError
from pdmesh.request import RequestOutput
from pdmesh.sampling_params import SamplingParams


class _Rejected:
    """The engine refused a request at admission (validation)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._queues: dict[str, asyncio.Queue[RequestOutput | BaseException | _Rejected]] = {}
        self._pending_adds: list[tuple[str, Callable[[], None]]] = []
        self._pending_calls: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self._pending_aborts: list[str] = []
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdmesh-step")
        self._loop_task: asyncio.Task[None] | None = None
        self._ids = itertools.count()

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | Mapping[str, Any] | None = None,
        request_id: str | None = None,
        hold_kv: bool = False,
    ) -> AsyncIterator[RequestOutput]:
        """Stream this request's outputs (deltas by default) until it finishes."""
        if not isinstance(params, SamplingParams):
            params = SamplingParams.from_dict(dict(params or {"output_kind": "delta"}))
        rid = request_id or f"async-{next(self._ids)}"
        checked = params

        def start() -> None:
            self.engine.add_request(rid, prompt, checked, hold_kv=hold_kv)

        async for out in self.stream(rid, start):
            yield out

    async def stream(self, rid: str, start: Callable[[], None]) -> AsyncIterator[RequestOutput]:
        """Run ``start`` between steps (it must put ``rid`` in the engine), then stream ``rid``.

        The engine is only touched by the loop task; an error from ``start`` (validation)
        comes back through the queue and is raised here, in the caller. Leaving early
        aborts the request and frees its blocks.
        """
        if rid in self._queues:
            raise InvalidRequestError("request_id", f"{rid!r} is already in flight")
        self._ensure_loop()
        queue: asyncio.Queue[RequestOutput | BaseException | _Rejected] = asyncio.Queue()
        self._queues[rid] = queue
        self._pending_adds.append((rid, start))
        self._wake.set()
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _Rejected):
                    finished = True  # never entered the engine: nothing to abort
                    raise item.error
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(rid, None)
            if not finished:
                self._pending_adds = [a for a in self._pending_adds if a[0] != rid]
                self._pending_aborts.append(rid)
                self._wake.set()

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine between steps and return its result (or raise its error)."""
        self._ensure_loop()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending_calls.append((fn, future))
        self._wake.set()
        return await future

    def abort(self, request_id: str) -> None:
        self._pending_aborts.append(request_id)
        self._wake.set()

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._apply_adds()
            self._apply_calls()
            self._apply_aborts()
            if not self.engine.has_unfinished_requests():
                self._wake.clear()
                if not (self._pending_adds or self._pending_calls or self._pending_aborts):
                    await self._wake.wait()
                continue
            try:
                outputs = await loop.run_in_executor(self._executor, self.engine.step)
            except Exception as exc:  # a broken step fails every stream, never hangs them
                for rid, queue in list(self._queues.items()):
                    queue.put_nowait(exc)
                    self._pending_aborts.append(rid)
                continue
            for out in outputs:
                queue = self._queues.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)

    def _apply_adds(self) -> None:
        adds, self._pending_adds = self._pending_adds, []
        for rid, start in adds:
            queue = self._queues.get(rid)
            if queue is None:
                continue  # the caller went away before its request was added
            try:
                start()
            except Exception as exc:
                queue.put_nowait(_Rejected(exc))

    def _apply_calls(self) -> None:
        calls, self._pending_calls = self._pending_calls, []
        for fn, future in calls:
            if future.cancelled():
                continue
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)

    def _apply_aborts(self) -> None:
        aborts, self._pending_aborts = self._pending_aborts, []
        for rid in aborts:
            with contextlib.suppress(KeyError):
                self.engine.abort_request(rid)

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        self._executor.shutdown(wait=True)
