"""Workers that split a machine's cores lend them while idle (one shared file, no lock)."""

from __future__ import annotations

import pytest

from pdmesh.engine.core_share import CoreShare, create_share_file, parse_spec


def _pair(tmp_path, total: int = 4):  # type: ignore[no-untyped-def]
    path = tmp_path / "cores"
    create_share_file(path, 2)
    calls: dict[str, list[int]] = {"prefill": [], "decode": []}
    prefill = CoreShare(path, 0, 2, total, calls["prefill"].append)
    decode = CoreShare(path, 1, 2, total, calls["decode"].append)
    return prefill, decode, calls


def test_an_idle_worker_lends_its_share_and_takes_it_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    prefill, decode, calls = _pair(tmp_path)
    assert prefill.busy() == 4  # the decode worker is idle: both shares
    assert decode.busy() == 2  # the prefill worker is busy: its own share only
    assert prefill.busy() == 2  # next step: the decode worker is busy now
    decode.idle()
    assert prefill.busy() == 4
    assert calls == {"prefill": [4, 2, 4], "decode": []}  # resized only on change
    assert prefill.lent_steps == 2


def test_going_idle_shrinks_back_to_the_own_share(tmp_path) -> None:  # type: ignore[no-untyped-def]
    prefill, _, calls = _pair(tmp_path)
    prefill.busy()
    prefill.idle()
    assert prefill.threads == 2
    assert calls["prefill"] == [4, 2]


def test_never_more_threads_than_the_machine_has(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "cores"
    create_share_file(path, 3)
    a = CoreShare(path, 0, 1, 2, lambda n: None)
    CoreShare(path, 1, 1, 2, lambda n: None)
    CoreShare(path, 2, 1, 2, lambda n: None)  # three workers on two cores, all idle
    assert a.busy() == 2


def test_a_worker_not_started_yet_lends_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "cores"
    create_share_file(path, 2)
    a = CoreShare(path, 0, 1, 2, lambda n: None)
    assert a.busy() == 1  # slot 1 has published no share


def test_bad_specs_and_slots_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "cores"
    create_share_file(path, 2)
    assert parse_spec(f"{path}:1") == (path, 1)
    for bad in ("cores", f"{path}:", ":1", f"{path}:x"):
        with pytest.raises(ValueError, match="PATH:SLOT"):
            parse_spec(bad)
    with pytest.raises(ValueError, match="outside"):
        CoreShare(path, 2, 1, 2, lambda n: None)
    with pytest.raises(ValueError, match="does not fit"):
        CoreShare(path, 0, 3, 2, lambda n: None)


def test_a_waking_worker_waits_for_the_step_running_on_its_lent_cores(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import threading

    prefill, decode, _ = _pair(tmp_path)
    assert decode.busy() == 4  # prefill idle: decode's step runs on both shares
    got: list[int] = []
    waker = threading.Thread(target=lambda: got.append(prefill.busy()))
    waker.start()
    waker.join(0.2)
    assert waker.is_alive() and not got  # not while decode's step holds its cores
    decode.step_done()
    waker.join(5)
    assert got == [2]  # then its own share: decode is busy
    assert decode.busy() == 2  # and decode's next step is on its own share


def test_a_borrower_that_never_ends_its_step_is_waited_for_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import threading

    prefill, decode, _ = _pair(tmp_path)
    decode.busy()  # borrowing, then (say) killed mid-step
    assert prefill.busy(wait_s=0.05) == 2
    prefill.idle()
    done = threading.Event()
    threading.Thread(target=lambda: (prefill.busy(wait_s=60), done.set()), daemon=True).start()
    assert done.wait(5)  # not waited for again while its mark stays as it was
    decode.idle()
    prefill.idle()
    assert decode.busy() == 4  # borrowing again, a new step: waited for again
    waker = threading.Thread(target=prefill.busy, daemon=True)
    waker.start()
    waker.join(0.2)
    assert waker.is_alive()
    decode.step_done()
    waker.join(5)
    assert not waker.is_alive()


def test_a_step_on_part_of_the_cores_gets_its_share_of_the_prompt_budget(tmp_path) -> None:  # type: ignore[no-untyped-def]
    prefill, decode, _ = _pair(tmp_path)
    assert prefill.prompt_budget(prefill.busy(), 2048) is None  # the peer is idle: every core
    assert decode.prompt_budget(decode.busy(), 2048) == 1024  # its own 2 of 4 cores
    assert decode.prompt_budget(1, 512) == 256  # a floor: too few rows waste the FMA units


def test_with_more_workers_than_cores_only_free_cores_are_lent(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "cores"
    create_share_file(path, 4)
    ws = [CoreShare(path, slot, 1, 2, lambda n: None) for slot in range(4)]  # 2 + 2 on two cores
    assert ws[0].busy() == 2  # alone: a peer's core is free
    ws[0].step_done()
    assert ws[1].busy() == 1  # ws[0] busy: one core left, its own
    assert ws[2].busy() == 1  # three busy on two cores: nothing to borrow though ws[3] idles
    assert ws[0].busy() == 1
    ws[1].idle()
    ws[2].idle()
    assert ws[0].busy() == 2
