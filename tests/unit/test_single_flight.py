"""One call per key in flight; every caller gets its outcome, and a caller that gives up
does not cancel it for the rest."""

from __future__ import annotations

import asyncio

import pytest

from pdmesh.rpc.single_flight import SingleFlight


def test_concurrent_callers_share_one_call_and_its_outcome() -> None:
    calls: list[str] = []

    async def connect(key: str) -> str:
        calls.append(key)
        await asyncio.sleep(0.05)
        return f"connected {key}"

    async def main() -> None:
        flights: SingleFlight[str] = SingleFlight()
        outs = await asyncio.gather(*(flights.run(k, lambda k=k: connect(k), 5.0) for k in "aaab"))
        assert outs == ["connected a"] * 3 + ["connected b"]
        assert calls == ["a", "b"]
        await flights.run("a", lambda: connect("a"), 5.0)  # landed: the next call runs again
        assert calls == ["a", "b", "a"]

    asyncio.run(main())


def test_a_caller_that_gives_up_leaves_the_call_to_the_others_and_errors_reach_all() -> None:
    async def slow() -> str:
        await asyncio.sleep(0.2)
        return "done"

    async def failing() -> str:
        await asyncio.sleep(0.05)
        raise ConnectionError("peer unreachable")

    async def main() -> None:
        flights: SingleFlight[str] = SingleFlight()
        impatient = asyncio.ensure_future(flights.run("p", slow, 0.05))
        patient = asyncio.ensure_future(flights.run("p", slow, 5.0))
        with pytest.raises(asyncio.TimeoutError):
            await impatient
        assert await patient == "done"
        results = await asyncio.gather(*(flights.run("q", failing, 5.0) for _ in range(3)),
                                       return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results)

    asyncio.run(main())
