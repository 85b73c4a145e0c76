"""KV pools in host memory: zeroed, aligned, touched, and on huge pages where the host
allows (read back from the kernel's own account of the mapping)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pdmesh.engine.kv_pool import kv_pool
from pdmesh.huge_pages import HUGE_PAGE, _thp_mode, host_pool

thp = _thp_mode()


def _mapping_kib(address: int, field: str) -> int:
    """``field`` (e.g. "AnonHugePages", "Rss") of the mapping holding ``address``, in KiB."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == f"{field}:":
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_pool_is_zeroed_aligned_and_already_faulted_in() -> None:
    pool = host_pool(3 * HUGE_PAGE + 4096)
    data = np.frombuffer(pool.buffer, dtype=np.uint8, count=pool.nbytes, offset=pool.offset)
    assert not data.any()
    assert (data.ctypes.data % HUGE_PAGE) == 0
    assert _mapping_kib(data.ctypes.data, "Rss") * 1024 >= pool.nbytes  # touched, not lazily mapped


@pytest.mark.skipif(thp not in ("always", "madvise"), reason=f"this host has no transparent huge pages ({thp!r})")
def test_on_a_host_with_thp_the_pool_is_on_huge_pages() -> None:
    tensor, detail = kv_pool((16, 2 * HUGE_PAGE // 4), torch.float32, torch.device("cpu"))
    assert "2 MiB pages" in detail
    assert _mapping_kib(tensor.data_ptr(), "AnonHugePages") * 1024 >= 16 * 2 * HUGE_PAGE
    tensor[3].fill_(1.5)  # an ordinary tensor over it
    assert float(tensor.sum()) == 1.5 * tensor[3].numel()


def test_a_pool_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="positive size"):
        host_pool(0)


def test_a_host_with_thp_off_gets_ordinary_pages_and_is_told(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The host's THP switch read as it would be with THP off (the sysfs file stood in
    for: a test cannot turn THP off for the machine)."""
    off = tmp_path / "enabled"
    off.write_text("always madvise [never]\n")
    monkeypatch.setattr("pdmesh.huge_pages.THP_ENABLED", off)
    pool = host_pool(HUGE_PAGE)
    assert not pool.huge
    assert pool.detail == "on 4 KiB pages: THP is never on this host"
    data = np.frombuffer(pool.buffer, dtype=np.uint8, count=pool.nbytes, offset=pool.offset)
    assert not data.any()


def test_an_untouched_pool_is_mapped_but_not_resident() -> None:
    """The kvstore's pool: zero, and faulted in only as it is used."""
    pool = host_pool(8 * HUGE_PAGE, touch=False)
    data = np.frombuffer(pool.buffer, dtype=np.uint8, count=pool.nbytes, offset=pool.offset)
    assert _mapping_kib(data.ctypes.data, "Rss") * 1024 < pool.nbytes
    assert not data[::4096].any()
