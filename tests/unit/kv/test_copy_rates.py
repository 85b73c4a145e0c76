"""The one-core copies beside raw NIXL's ceilings: they copy every byte, both ways, and
refuse what they cannot copy rather than corrupt memory."""

from __future__ import annotations

import platform
import shutil

import pytest
import torch

from pdmesh.bench import copy_rates

needs_build = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not (shutil.which("cc") or shutil.which("gcc")),
    reason="the copies are x86-64 C built with the host's compiler; this host has neither")


@needs_build
@pytest.mark.parametrize("streamed", [False, True])
def test_copies_every_byte(streamed: bool) -> None:
    src = torch.randn(3, 16384)
    dst = torch.zeros(3, 16384)
    copy_rates.copy_blocks(dst[1].data_ptr(), src[1].data_ptr(), src[1].nbytes, streamed)
    assert torch.equal(dst[1], src[1])
    assert not dst[0].any() and not dst[2].any()  # nothing past the block's ends


@needs_build
def test_refuses_a_size_or_address_it_cannot_copy() -> None:
    src = torch.randn(64)
    dst = torch.zeros(64)
    with pytest.raises(ValueError, match="64-byte multiples"):
        copy_rates.copy_blocks(dst.data_ptr(), src.data_ptr(), 100, streamed=False)
    with pytest.raises(ValueError, match="aligned"):
        copy_rates.copy_blocks(dst.data_ptr() + 4, src.data_ptr(), 64, streamed=True)


@needs_build
@pytest.mark.parametrize("fresh", [False, True])
def test_rates_are_measured(fresh: bool) -> None:
    assert copy_rates.copy_gib_s(64 * 1024, 4, streamed=fresh, fresh_src=fresh, fresh_dst=True) > 0


def test_a_host_without_a_compiler_is_told_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copy_rates.shutil, "which", lambda _: None)
    monkeypatch.setattr(copy_rates.platform, "machine", lambda: "x86_64")
    copy_rates._library.cache_clear()
    try:
        with pytest.raises(copy_rates.CopyRatesUnavailableError, match="no C compiler"):
            copy_rates.copy_gib_s(64 * 1024, 4)
    finally:
        copy_rates._library.cache_clear()
