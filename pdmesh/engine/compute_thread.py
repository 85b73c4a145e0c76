"""Build an engine on a thread that then exits, so the engine thread is the process's only
OpenMP pool.

GNU OpenMP (the runtime torch's CPU build uses) keeps one pool of worker threads per
thread that starts a parallel region, and counts every pool's threads together: once
the process holds more of them than the machine has cores, each waiting thread spins
100 times instead of ~300,000 before it sleeps in the kernel, so every parallel region
(hundreds per forward pass) pays a futex wake-up per thread. A worker that loaded its
model on the main thread (weights, the zeroed KV pool: parallel regions) and then
stepped on its engine thread held two pools; measured on 2 cores, a lone 256-token
prefill took 147-151 ms that way against 128 ms with one pool
(``scripts/probes/prefill/openmp_pools.py``; docs/performance/log.md section 14).

A pool lives until the thread that owns it exits, and a later one-thread region on that
thread does not shrink it (measured: no change), so the only cure is not to create a
second one: the worker builds its engine on a thread of its own that ends once the
engine exists, and from then on only the engine thread runs torch kernels (the event
loop does bookkeeping under the engine lock, never tensor work).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_BUILD_TIMEOUT_S = 3600.0
"""Loading a large checkpoint from a slow disk can take many minutes; never forever."""


def build_on_passing_thread(factory: Callable[[], T], name: str = "pdmesh-load") -> T:
    """``factory()`` on a new thread that exits before this returns (its OpenMP pool goes
    with it); its exception is raised here."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(factory())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            error.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(_BUILD_TIMEOUT_S)
    if thread.is_alive():
        raise TimeoutError(f"building on thread {name} took more than {_BUILD_TIMEOUT_S:.0f}s")
    if error:
        raise error[0]
    return result[0]
