"""Linear plans shared by the processes of one machine (``pdmesh.model.plan_store``), and
``linear_plan.choose`` taking one instead of measuring."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from pdmesh.measure_lock import STATE_DIR_ENV
from pdmesh.model import linear_plan, onednn, plan_store
from pdmesh.model.linear_plan import Product


def test_a_stored_plan_is_taken_until_it_is_too_old(tmp_path: Path) -> None:
    path = tmp_path / "plans.json"
    plan_store.save("k", ("kernel", "oneDNN"), path=path, now=1000.0)
    got = plan_store.load("k", path=path, now=1000.0 + plan_store.REUSE_S - 1)
    assert got is not None and got.products == ("kernel", "oneDNN") and got.age_s == plan_store.REUSE_S - 1
    assert plan_store.load("k", path=path, now=1000.0 + plan_store.REUSE_S) is None
    assert plan_store.load("other", path=path, now=1000.0) is None
    # Saving another drops what has expired.
    plan_store.save("k2", ("mm",), path=path, now=1000.0 + plan_store.REUSE_S + 1)
    assert plan_store.load("k", path=path, now=1000.0) is None


def test_a_store_that_cannot_be_read_or_written_costs_a_measurement_not_a_start(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "plans.json"
    bad.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="pdmesh.model.plan_store"):
        assert plan_store.load("k", path=bad) is None
        plan_store.save("k", ("mm",), path=tmp_path / "no-such-folder" / "plans.json")
    assert "cannot read" in caplog.text and "cannot store" in caplog.text
    assert list(tmp_path.iterdir()) == [bad]  # no temporary file left behind


def test_entries_not_in_the_stores_form_are_measured_again_and_dropped(tmp_path: Path) -> None:
    path = tmp_path / "plans.json"
    path.write_text('{"a": {"at": "yesterday", "products": ["mm"]}, "b": {"at": 1000.0, "products": 5},'
                    ' "c": {"at": 1000.0, "products": [1, 2]}, "d": {"at": 1000.0, "products": ["mm"], "pid": "x"},'
                    ' "e": 7}')
    for key in "abcde":
        assert plan_store.load(key, path=path, now=1000.0) is None
    plan_store.save("k", ("mm",), path=path, now=1000.0)
    assert set(json.loads(path.read_text())) == {"k"}


@pytest.mark.skipif(not onednn.available(), reason="this torch build has no oneDNN (mkldnn)")
def test_choose_shares_its_plan_with_the_next_process_on_the_same_shapes(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))  # the store and the lock live here
    calls = [0]

    def slow(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return [x @ w.t() for _ in range(30)][-1]

    weights = [torch.randn(128, 128)]
    first = linear_plan.choose(weights, {Product.MM: slow, Product.LINEAR: slow}, share=True)
    measured = calls[0]
    assert measured and first.packs  # oneDNN's one product beats thirty
    again = linear_plan.choose(weights, {Product.MM: slow, Product.LINEAR: slow}, share=True)
    assert again == first and calls[0] == measured  # taken as stored: nothing timed
    linear_plan.choose([torch.randn(64, 128)], {Product.MM: slow, Product.LINEAR: slow}, share=True)
    assert calls[0] > measured  # other shapes: measured
    before = calls[0]
    linear_plan.choose(weights, {Product.MM: slow, Product.LINEAR: slow})
    assert calls[0] > before  # not shared: measured


def test_a_stored_plan_this_version_cannot_run_is_measured_again(monkeypatch, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(plan_store, "load", lambda key: plan_store.Stored(("kernel",) * 9, 1.0, 1))  # 64+ rows: no
    calls = [0]

    def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return x @ w.t()

    with caplog.at_level(logging.WARNING, logger="pdmesh.model.linear_plan"):
        plan = linear_plan.choose([torch.randn(32, 32)], {Product.MM: product, Product.LINEAR: product}, share=True)
    assert calls[0] and "not one this version can run" in caplog.text
    assert Product.KERNEL not in plan.products  # no kernel was offered


def test_a_plan_timed_on_another_build_of_a_product_is_measured_again(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """pdmesh's kernels are a module named by a digest of their sources: a plan timed on
    an older few-row kernel (an upgrade within the store's ten minutes, or two checkouts
    compared side by side) must not decide for a newer one."""
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    calls = [0]

    def build(module: str):  # type: ignore[no-untyped-def]
        def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            return x @ w.t()
        product.__module__ = module
        return product

    weights = [torch.randn(64, 64)]
    old = build("pdmesh_cpu_kernels_000000000001")
    linear_plan.choose(weights, {Product.MM: old, Product.LINEAR: old}, share=True)
    measured = calls[0]
    linear_plan.choose(weights, {Product.MM: old, Product.LINEAR: old}, share=True)
    assert calls[0] == measured  # the same build: taken as stored
    new = build("pdmesh_cpu_kernels_000000000002")
    linear_plan.choose(weights, {Product.MM: new, Product.LINEAR: new}, share=True)
    assert calls[0] > measured  # another build: measured
