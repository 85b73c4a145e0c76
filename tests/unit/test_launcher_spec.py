"""What the launcher decides for workers that split one machine's cores."""

from __future__ import annotations

from pdmesh.launcher import COLOCATED_PREFILL_BUSY_REQUESTS, COLOCATED_PREFILL_BUSY_TOKENS, MeshSpec


def test_workers_on_one_cpu_lend_cores_and_prefill_locally_when_the_prefill_worker_is_busy() -> None:
    spec = MeshSpec(model="m", prefill=1, decode=1)
    assert spec.splits_cpu_cores()
    assert spec.colocated_router_args() == ["--prefill-busy-requests", str(COLOCATED_PREFILL_BUSY_REQUESTS),
                                            "--prefill-busy-tokens", str(COLOCATED_PREFILL_BUSY_TOKENS)]


def test_no_sharing_when_the_user_fixed_threads_or_device_or_turned_it_off() -> None:
    for spec in (MeshSpec(model="m", worker_args=["--threads", "4"]),
                 MeshSpec(model="m", decode_args=["--threads", "4"]),
                 MeshSpec(model="m", worker_args=["--device", "cuda"]),
                 MeshSpec(model="m", share_cores=False),
                 MeshSpec(model="m", prefill=0, decode=1)):
        assert not spec.splits_cpu_cores(), spec
        assert spec.colocated_router_args() == []


def test_the_users_own_rule_is_kept() -> None:
    spec = MeshSpec(model="m", router_args=["--prefill-busy-requests", "0"])
    assert spec.colocated_router_args() == []
    assert MeshSpec(model="m", prefill=0, decode=2, router_args=["--decode-policy", "holder"]
                    ).colocated_router_args() == []  # no prefill worker to divert from, the policy set


def test_decode_workers_sharing_the_cores_pack_their_batches() -> None:
    assert MeshSpec(model="m", prefill=0, decode=2).colocated_router_args() == ["--decode-policy", "pack"]
    assert MeshSpec(model="m", prefill=1, decode=2).colocated_router_args()[-2:] == ["--decode-policy", "pack"]
    assert "--decode-policy" not in MeshSpec(model="m", prefill=1, decode=1).colocated_router_args()
    assert MeshSpec(model="m", prefill=1, decode=2, worker_args=["--threads", "1"]).colocated_router_args() == []
