"""``AsyncLLMEngine``: many concurrent ``generate`` streams over one engine loop.

The loop task runs each ``step()`` on a worker thread (torch releases the GIL), so the
event loop stays responsive while the model runs. Coroutines add requests and do hand-off
bookkeeping directly under the engine's lock, which a step does not hold during its forward
pass; only aborts wait for the step in flight to end, since they free blocks that step may
be writing. Closing a ``generate`` iterator (client gone, task cancelled) aborts the request
and frees its blocks.
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


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._queues: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._pending_aborts: list[str] = []
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdmesh-step")
        self._loop_task: asyncio.Task[None] | None = None
        self._ids = itertools.count()
        self._progress_listeners: dict[str, tuple[Callable[[int], None], int]] = {}
        """request id -> (listener, full prompt blocks it was last told)."""

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
        """Run ``start`` (it must put ``rid`` in the engine), then stream ``rid``'s outputs.

        An error from ``start`` (validation, capacity) is raised here, before anything is
        streamed. Leaving early aborts the request and frees its blocks.
        """
        if rid in self._queues:
            raise InvalidRequestError("request_id", f"{rid!r} is already in flight")
        self._ensure_loop()
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._queues[rid] = queue
        try:
            self.call(start)
        except BaseException:
            del self._queues[rid]
            raise
        self._dispatch(self.engine.take_ready_outputs())
        self._wake.set()
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(rid, None)
            if not finished:
                self.abort(rid)

    def watch_progress(self, rid: str, listener: Callable[[int], None] | None) -> None:
        """Call ``listener(full_prompt_blocks)`` after each step that completed more of
        ``rid``'s prompt blocks; None stops watching."""
        if listener is None:
            self._progress_listeners.pop(rid, None)
        else:
            self._progress_listeners[rid] = (listener, 0)

    def _notify_progress(self) -> None:
        if not self._progress_listeners:
            return
        progress = self.engine.handoff.prefill_progress
        with self.engine.lock:
            grown = [(rid, fn, progress(rid)) for rid, (fn, last) in self._progress_listeners.items()]
        for rid, fn, blocks in grown:
            if blocks > self._progress_listeners.get(rid, (fn, blocks))[1]:
                self._progress_listeners[rid] = (fn, blocks)
                fn(blocks)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine now, under its lock (not held during forward passes).

        For bookkeeping only (add, reserve, commit, release, Info): it must not free blocks
        a running step may write, which is why aborts go through ``abort`` instead.
        """
        with self.engine.lock:
            return fn()

    def abort(self, request_id: str) -> None:
        """Abort between steps (the step in flight may be writing the request's blocks)."""
        self._pending_aborts.append(request_id)
        self._wake.set()

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._apply_aborts()
            self._dispatch(self.engine.take_ready_outputs())
            if not self.engine.has_unfinished_requests():
                self._wake.clear()
                if not self._pending_aborts:
                    await self._wake.wait()
                continue
            try:
                outputs = await loop.run_in_executor(self._executor, self.engine.step)
            except Exception as exc:  # a broken step fails every stream, never hangs them
                for rid, queue in list(self._queues.items()):
                    queue.put_nowait(exc)
                    self._pending_aborts.append(rid)
                continue
            self._notify_progress()
            self._dispatch(outputs)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            queue = self._queues.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)

    def _apply_aborts(self) -> None:
        aborts, self._pending_aborts = self._pending_aborts, []
        for rid in aborts:
            with contextlib.suppress(KeyError), self.engine.lock:
                self.engine.abort_request(rid)

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        self._executor.shutdown(wait=True)
