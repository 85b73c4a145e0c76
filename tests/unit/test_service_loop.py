"""Services run on uvloop unless told otherwise; a wrong choice is an error."""

from __future__ import annotations

import asyncio

import pytest

from pdmesh.errors import PdmeshError
from pdmesh.rpc.process import LOOP_ENV, run_service_loop


def _loop_module(monkeypatch: pytest.MonkeyPatch, choice: str | None) -> str:
    if choice is None:
        monkeypatch.delenv(LOOP_ENV, raising=False)
    else:
        monkeypatch.setenv(LOOP_ENV, choice)
    seen: list[str] = []

    async def main() -> None:
        seen.append(type(asyncio.get_running_loop()).__module__)

    run_service_loop(main())
    return seen[0]


def test_services_run_on_uvloop_by_default_and_on_asyncio_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _loop_module(monkeypatch, None).startswith("uvloop")
    assert _loop_module(monkeypatch, "uvloop").startswith("uvloop")
    assert _loop_module(monkeypatch, "asyncio").startswith("asyncio")


def test_an_unknown_event_loop_is_an_error_not_a_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PdmeshError, match="uvloop"):
        _loop_module(monkeypatch, "trio")
