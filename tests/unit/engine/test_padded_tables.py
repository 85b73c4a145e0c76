"""The torch and CPU backends' padded block tables, built through numpy every step."""

import random

import torch

from pdmesh.engine.model_runner import _padded


def test_padded_tables_match_padding_each_row_with_block_zero() -> None:
    rng = random.Random(3)
    for rows in (1, 2, 33):
        tables = [[rng.randrange(1, 10_000) for _ in range(rng.randrange(1, 70))] for _ in range(rows)]
        width = max(map(len, tables))
        expected = torch.tensor([t + [0] * (width - len(t)) for t in tables])
        got = _padded(tables, "cpu")
        assert got.dtype == torch.int64 and torch.equal(got, expected)
