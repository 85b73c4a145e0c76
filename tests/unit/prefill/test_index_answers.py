"""When a prefill worker may skip its kvstore lookup on the router's index view."""

from __future__ import annotations

from pdmesh.mesh_types import WorkerInfo
from services.prefill.kvstore_tier import index_answers

STORE = WorkerInfo(worker_id="kvstore-0", role="kvstore", publishes_index=True)


def test_a_view_listing_no_more_than_the_worker_holds_answers() -> None:
    assert index_answers({}, STORE, 0)  # the index listed nothing of the prompt
    assert index_answers({"kvstore-0": 3, "p1": 9}, STORE, 3)  # another holder's count is not the store's
    assert index_answers({"other-store": 9}, STORE, 0)


def test_the_store_is_asked_when_the_view_cannot_say() -> None:
    assert not index_answers({"kvstore-0": 4}, STORE, 3)  # it lists more there: fetch it
    assert not index_answers(None, STORE, 0)  # the router did not read the index
    assert not index_answers({}, None, 0)  # the store's Info has not come
    silent = WorkerInfo(worker_id="kvstore-0", role="kvstore", publishes_index=False)
    assert not index_answers({}, silent, 0)  # a store that publishes nothing is never listed
