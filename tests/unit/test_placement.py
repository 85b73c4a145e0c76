"""Which GPU each worker of ``pdmesh up`` gets (``pdmesh/placement.py``)."""

from __future__ import annotations

import pytest

from pdmesh.errors import InvalidRequestError
from pdmesh.placement import Placement, place


def test_one_gpu_per_worker_prefill_first() -> None:
    assert place(2, 2, "cuda", count_gpus=4) == Placement(("0", "1"), ("2", "3"))
    assert place(1, 2, "cuda", gpus="3,1,2") == Placement(("3",), ("1", "2"))
    assert place(2, 1, "cuda", gpus="7", prefill_gpus="0,1") == Placement(("0", "1"), ("7",))
    assert place(1, 1, "cuda", prefill_gpus="GPU-0a1b-22", decode_gpus="MIG-3/1/0") == \
        Placement(("GPU-0a1b-22",), ("MIG-3/1/0",))


def test_cpu_without_a_list_is_left_alone_and_a_shared_id_is_said() -> None:
    assert place(2, 2, "cpu") == Placement()
    assert place(1, 1, "cuda", gpus="0,0").shared == ("0",)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"gpus": "0"}, "gpus: 2 workers (1 prefill + 1 decode) need 2 GPU ids (repeat an id to share a GPU), got 1"),
    ({"gpus": "0,1,2"}, "need 2 GPU ids"),
    ({"prefill_gpus": "0,1"}, "prefill_gpus: 1 prefill workers need 1 GPU ids, got 2 (0,1)"),
    ({"gpus": "zero"}, "gpus: expected GPU ids such as 0,1,2"),
    ({"count_gpus": 1}, "gpus: 2 workers and 1 GPUs visible: give --gpus with one id per worker"),
])
def test_a_list_that_does_not_fit_is_refused_naming_the_flag(kwargs: dict, needle: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidRequestError) as err:
        place(1, 1, "cuda", **kwargs)
    assert needle in str(err.value)
