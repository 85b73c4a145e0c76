"""The linear plan: each range of row counts computed by the product measured fastest for
it (``pdmesh.model.linear_plan``). Every product gives ``F.linear``'s values to float32
rounding; the decision rule picks exactly what its timings say; greedy tokens stay those of
``transformers`` with oneDNN everywhere and with every product in one model."""

from __future__ import annotations

import pytest
import torch

from pdmesh import LLM, SamplingParams
from pdmesh.attention.cpu_kernels import load
from pdmesh.model import linear_plan, onednn
from pdmesh.model.layers import GatedMLP, Linear, few_rows_kernel, linear
from pdmesh.model.linear_plan import (
    DEFAULT_PRODUCTS,
    KERNEL_MAX_ROWS,
    MARGIN,
    ONEDNN_EVERYWHERE,
    RANGES,
    LinearPlan,
    Product,
    decide,
)
from tests.oracle import mixed_prompts

needs_onednn = pytest.mark.skipif(not onednn.available(), reason="this torch build has no oneDNN (mkldnn)")
KERNELS = load()
K, L, M, D = Product.KERNEL, Product.LINEAR, Product.MM, Product.ONEDNN
MIXED = LinearPlan((K, L, D, K, D, K, M, D, L))
"""Every product somewhere, each where it can serve."""


def test_each_row_count_finds_its_range() -> None:
    plan = LinearPlan(tuple(Product.LINEAR if i % 2 else Product.MM for i in range(len(RANGES) - 1)) + (L,))
    ranges = {1: 0, 2: 1, 3: 1, 4: 2, 7: 2, 8: 3, 15: 3, 16: 4, 31: 4, 32: 5, 47: 5, 48: 6, 63: 6, 64: 7, 256: 7,
              257: 8, 10**6: 8}
    for rows, i in ranges.items():
        assert plan.product(rows) is plan.products[i], rows
    assert LinearPlan().products == DEFAULT_PRODUCTS and not LinearPlan().packs
    assert ONEDNN_EVERYWHERE.onednn_only and not MIXED.onednn_only and MIXED.packs


def test_a_plan_never_gives_a_product_rows_beyond_its_reach() -> None:
    with pytest.raises(ValueError, match="kernel cannot compute 64 rows"):
        LinearPlan((K,) * 8 + (L,))
    with pytest.raises(ValueError, match="mm cannot compute 257 rows"):
        LinearPlan((K,) * 5 + (M,) * 4)
    with pytest.raises(ValueError, match="one per range"):
        LinearPlan((L,))


@needs_onednn
@pytest.mark.parametrize("rows", [1, 2, 5, 9, KERNEL_MAX_ROWS, 40, 100, 300])
def test_every_product_gives_f_linears_values(rows: int) -> None:
    torch.manual_seed(rows)
    weight, bias = torch.randn(96, 512), torch.randn(96)
    x = torch.randn(rows, 512)
    reference = torch.nn.functional.linear(x, weight, bias)
    kernel = few_rows_kernel(KERNELS)
    for plan in (LinearPlan(), MIXED, ONEDNN_EVERYWHERE, LinearPlan((L,) * len(RANGES))):
        got = linear(x, weight, bias, kernel, onednn.pack(weight), plan)
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-4)
        # A transposed view (what the MM product hands on) is read as the rows it is.
        torch.testing.assert_close(linear(x.t().contiguous().t(), weight, bias, kernel, onednn.pack(weight), plan),
                                   reference, rtol=1e-5, atol=1e-4)


def test_a_plan_that_runs_onednn_without_the_packed_weight_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="needs the weight packed"):
        linear(torch.randn(3, 8), torch.randn(4, 8), plan=ONEDNN_EVERYWHERE)


@needs_onednn
@pytest.mark.parametrize("rows", [1, 5, 300])
def test_the_mlp_with_gate_and_up_packed_as_one_matches_two_products(rows: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from pdmesh.model import layers

    monkeypatch.setattr(layers, "GATE_UP_BLOCK_BYTES", 1)  # 64 rows at a time: 300 in five blocks
    torch.manual_seed(rows)
    mlp = GatedMLP(64, 160, bias=True)
    x = torch.randn(rows, 64)
    reference = mlp(x)
    for m in (mlp.gate, mlp.up, mlp.down):
        m.plan, m.packed = ONEDNN_EVERYWHERE, onednn.pack(m.weight)
    mlp.fuse_packed()
    for kernels in (None, KERNELS):
        mlp.kernels = kernels
        torch.testing.assert_close(mlp(x), reference, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mlp(x[None]), reference[None], rtol=1e-5, atol=1e-5)  # 3-D: the same rows
    # A range the plan gives another product keeps the two products.
    for m in (mlp.gate, mlp.up, mlp.down):
        m.plan = LinearPlan((L,) + ONEDNN_EVERYWHERE.products[1:])
    mlp.gate.weight.data.zero_()  # the separate gate now gives silu(0) = 0; the packed copy would not
    mlp.gate.bias.data.zero_()
    assert torch.equal(mlp(x[:1]), mlp.down(torch.zeros(1, 160)))


def _timings(**seconds: list[float]) -> list[dict[Product, float]]:
    """Per range, seconds by product from lists named after the products."""
    by = {Product[name.upper()]: values for name, values in seconds.items()}
    return [{p: v[i] for p, v in by.items()} for i in range(len(RANGES))]


def test_the_default_is_left_only_for_a_clear_gain() -> None:
    defaults = DEFAULT_PRODUCTS
    # F.linear 1.04x the default in every range: a near tie keeps the default; at 1.06x it is taken.
    near = decide(defaults, _timings(kernel=[1.04] * 7 + [9] * 2, mm=[9] * 7 + [1.04] + [9],
                                     linear=[1.0] * 9))
    assert near.products == defaults
    clear = decide(defaults, _timings(kernel=[1.06] * 7 + [9] * 2, mm=[9] * 7 + [1.06] + [9], linear=[1.0] * 9))
    assert clear.products == (L,) * 9


def test_onednn_is_packed_only_where_it_pays_for_its_copy_and_then_wherever_it_wins() -> None:
    base = {"kernel": [1.0] * 9, "mm": [1.0] * 9, "linear": [1.0] * 9}
    # 1.10x everywhere: never worth a second copy of the weights.
    assert decide(DEFAULT_PRODUCTS, _timings(**base, onednn=[1 / 1.10] * 9)).products == DEFAULT_PRODUCTS
    # 1.2x at 16-31 rows pays for the copy; then every range it wins by 5% takes it too.
    gains = [0.9, 1.04, 1.06, 1.1, 1.2, 1.0, 1.0, 1.06, 0.8]
    plan = decide(DEFAULT_PRODUCTS, _timings(**base, onednn=[1 / g for g in gains]))
    assert plan.products == (K, K, D, D, D, K, K, D, L)
    assert MARGIN > 1.06  # the 1.06x ranges ride on the 1.2x one


def _products(costs: dict[Product, object]):  # type: ignore[no-untyped-def]
    """Fake products whose cost by row count is ``costs[p](rows)`` repeated products."""
    def make(cost):  # type: ignore[no-untyped-def]
        return lambda x, w: [x @ w.t() for _ in range(cost(x.shape[0]))][-1] if cost(x.shape[0]) else x
    return {p: make(c) for p, c in costs.items()}


@needs_onednn
def test_choose_times_each_range_on_the_weights() -> None:
    weights = [torch.randn(256, 256) for _ in range(2)]
    free = linear_plan.choose(weights, _products({K: lambda r: 0, M: lambda r: 0, L: lambda r: 60}))
    assert free.products == (K,) * 7 + (M, D)  # nothing beats a product that costs nothing
    # One row costs nothing through the default, every other row count 60 products.
    plan = linear_plan.choose(weights, _products({K: lambda r: 0 if r == 1 else 60, M: lambda r: 60,
                                                  L: lambda r: 60}))
    assert plan.products == (K,) + (D,) * 8  # one row keeps its own; oneDNN everywhere else
    assert linear_plan.choose(weights, _products({K: lambda r: 1, M: lambda r: 1, L: lambda r: 1}),
                              always=True) == ONEDNN_EVERYWHERE


@needs_onednn
def test_the_streamed_probes_pack_a_bounded_prefix_of_the_weights(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Six 16 KiB weights and one of another shape, a budget of two: the streamed probes
    # read the first two, the others one of each shape; nothing else is packed.
    weights = [torch.randn(64, 64) for _ in range(6)] + [torch.randn(32, 64)]
    monkeypatch.setattr(linear_plan, "STREAMED_PROBE_BYTES", 2 * 64 * 64 * 4)
    packed: list[torch.Tensor] = []
    pack = onednn.pack
    monkeypatch.setattr(onednn, "pack", lambda w: packed.append(w) or pack(w))
    linear_plan.choose(weights, _products({M: lambda r: 0, L: lambda r: 0}))
    assert [id(w) for w in packed] == [id(weights[0]), id(weights[1]), id(weights[6])]
    assert linear_plan.leading_bytes(weights, 1) == weights[:1]


@needs_onednn
def test_greedy_matches_transformers_with_onednn_everywhere(monkeypatch, llama_dir, hf_refs) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PDMESH_ONEDNN", "always")
    prompts = mixed_prompts(10, seed=1)
    llm = LLM(str(llama_dir), dtype="float32", num_blocks=512)
    model = llm.engine.runner.model
    assert model.plan == ONEDNN_EVERYWHERE and model.head_packed is not None
    # Used for every row count: only oneDNN's copy of the weights is kept.
    assert all(m.weight.numel() == 0 for m in model.modules() if isinstance(m, Linear))
    assert all(m.gate_up is not None for m in model.modules() if isinstance(m, GatedMLP))  # one product
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24))
    want = [hf_refs["llama"].greedy(p, 24) for p in prompts]
    assert [o.outputs[0].token_ids for o in outs] == want


@needs_onednn
def test_greedy_matches_transformers_with_every_product_in_one_model(monkeypatch, llama_dir, hf_refs) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PDMESH_ONEDNN", "0")  # no measurement: the plan is set below
    prompts = mixed_prompts(10, seed=2)  # decode batches of 1 to 10 rows, and prompt steps
    llm = LLM(str(llama_dir), dtype="float32", num_blocks=512)
    model = llm.engine.runner.model
    assert model.plan == LinearPlan() and model.head_packed is None
    model.apply_linear_plan(MIXED)
    assert model.plan == MIXED and model.head_packed is not None
    assert all(m.weight.numel() > 0 and m.plan == MIXED for m in model._body_linears())  # the head: model.plan
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24))
    want = [hf_refs["llama"].greedy(p, 24) for p in prompts]
    assert [o.outputs[0].token_ids for o in outs] == want
