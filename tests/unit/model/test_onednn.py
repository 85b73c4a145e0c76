"""oneDNN's packed-weight product: the same values as ``F.linear`` to float32 rounding, and,
forced on for every row count, greedy tokens still those of ``transformers`` (on machines
where the measurement picks it, ``PDMESH_ONEDNN=auto``, it runs for some row counts only)."""

from __future__ import annotations

import pytest
import torch

from pdmesh import LLM, SamplingParams
from pdmesh.attention.cpu_kernels import load
from pdmesh.model import layers, onednn
from pdmesh.model.layers import KERNEL_MAX_ROWS, GatedMLP, Linear, linear
from tests.conftest import mixed_prompts

pytestmark = pytest.mark.skipif(not onednn.available(), reason="this torch build has no oneDNN (mkldnn)")
KERNELS = load()


@pytest.mark.parametrize("rows", [1, 7, KERNEL_MAX_ROWS, 64, 300])
def test_the_packed_product_matches_f_linear(rows: int) -> None:
    torch.manual_seed(rows)
    weight, bias = torch.randn(96, 512), torch.randn(96)
    x = torch.randn(rows, 512)
    plan = onednn.LinearPlan(few=True, many=True)
    got = linear(x, weight, bias, packed=(onednn.pack(weight), plan))
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-4)
    # A transposed view (what ``linear``'s few-row path returns) is read as the rows it is.
    torch.testing.assert_close(linear(x.t().contiguous().t(), weight, None, packed=(onednn.pack(weight), plan)),
                               x @ weight.t(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 5, 300])
def test_the_mlp_with_gate_and_up_packed_as_one_matches_two_products(rows: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(layers, "GATE_UP_BLOCK_BYTES", 1)  # 64 rows at a time: 300 in five blocks
    torch.manual_seed(rows)
    mlp = GatedMLP(64, 160, bias=True)
    x = torch.randn(rows, 64)
    reference = mlp(x)
    mlp.fuse_packed(onednn.LinearPlan(few=True, many=True))
    for kernels in (None, KERNELS):
        mlp.kernels = kernels
        torch.testing.assert_close(mlp(x), reference, rtol=1e-5, atol=1e-5)
    # A regime the plan leaves out keeps the two products.
    mlp.fuse_packed(onednn.LinearPlan(few=False, many=True))
    mlp.gate.weight.data.zero_()  # the separate gate now gives silu(0) = 0; the packed copy would not
    mlp.gate.bias.data.zero_()
    assert torch.equal(mlp(x[:1]), mlp.down(torch.zeros(1, 160)))


def test_a_plan_is_taken_only_where_it_pays() -> None:
    weights = [torch.randn(64, 64)]
    free = onednn.choose(weights, lambda x, w: x, KERNEL_MAX_ROWS)
    assert free == onednn.LinearPlan()  # a product that costs nothing is never replaced
    slow = onednn.choose(weights, lambda x, w: [x @ w.t() for _ in range(50)][-1], KERNEL_MAX_ROWS)
    assert slow.few and slow.many  # 50 products against one: oneDNN wins both regimes


def test_the_few_rows_regime_is_not_taken_where_one_row_would_get_slower() -> None:
    # A product that costs nothing at one row and 50 products from two rows up: oneDNN
    # wins at 16 and 256 rows, but a low-load token (one row) would pay for it.
    weights = [torch.randn(64, 64)]
    plan = onednn.choose(weights, lambda x, w: x if x.shape[0] == 1 else [x @ w.t() for _ in range(50)][-1],
                         KERNEL_MAX_ROWS)
    assert plan == onednn.LinearPlan(few=False, many=True)


def test_the_few_rows_probes_pack_a_bounded_prefix_of_the_weights(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Six 16 KiB weights and one of another shape, a budget of two: the few-rows probes
    # read the first two, the many-rows probe one of each shape; nothing else is packed.
    weights = [torch.randn(64, 64) for _ in range(6)] + [torch.randn(32, 64)]
    monkeypatch.setattr(onednn, "STREAMED_PROBE_BYTES", 2 * 64 * 64 * 4)
    packed: list[torch.Tensor] = []
    pack = onednn.pack
    monkeypatch.setattr(onednn, "pack", lambda w: packed.append(w) or pack(w))
    onednn.choose(weights, lambda x, w: x, KERNEL_MAX_ROWS)
    assert [id(w) for w in packed] == [id(weights[0]), id(weights[1]), id(weights[6])]
    assert onednn.leading_bytes(weights, 1) == weights[:1]


def test_greedy_matches_transformers_with_onednn_everywhere(monkeypatch, llama_dir, hf_refs) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PDMESH_ONEDNN", "always")
    prompts = mixed_prompts(10, seed=1)
    llm = LLM(str(llama_dir), dtype="float32", num_blocks=512)
    model = llm.engine.runner.model
    assert model.head_packed is not None and model.head_packed[1].few and model.head_packed[1].many
    # Used for every row count: only oneDNN's copy of the weights is kept.
    assert all(m.weight.numel() == 0 for m in model.modules() if isinstance(m, Linear))
    assert all(m.gate_up is not None for m in model.modules() if isinstance(m, GatedMLP))  # one product
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24))
    want = [hf_refs["llama"].greedy(p, 24) for p in prompts]
    assert [o.outputs[0].token_ids for o in outs] == want
