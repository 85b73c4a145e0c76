"""``pdmesh bench route-mesh``'s measurement: Poisson traffic through a real mesh, and
what each policy cost read back from the workers' own counters."""

from __future__ import annotations

from pathlib import Path

from pdmesh.bench.routing.mesh_run import MeshRunSpec, run_policy, summarize
from pdmesh.bench.routing.traffic import TrafficSpec, build_traffic


def test_route_mesh_accounts_for_every_prompt_token_and_cache_aware_computes_less(llama_dir: Path,
                                                                                tmp_path: Path) -> None:
    traffic = build_traffic(TrafficSpec(num_requests=24, groups=3, prefix_len=128, suffix_len=16, chat_share=0.25,
                                        turns=2, turn_len=16, output_len=2, vocab=1000))
    spec = MeshRunSpec(str(llama_dir), think_s=0.05)
    rows = {}
    for policy in ("round_robin", "cache_aware"):
        records, seconds, counts, reasons = run_policy(traffic, spec, policy, 20.0, str(tmp_path / policy))
        assert len(records) == len(traffic.jobs) and all(r.ok for r in records.values()), \
            [r.error for r in records.values() if r.error]
        # Every prompt was prefilled once on a prefill worker: computed + cached = its tokens,
        # and the decode worker computed none itself.
        assert sum(c.computed + c.cached for c in counts if c.role == "prefill") == traffic.prompt_tokens
        assert [c.computed for c in counts if c.role == "decode"] == [0]
        # The router's own count: each job and the two warm-up requests, one decision each.
        assert sum(n for k, n in reasons.items() if k.startswith(f"{policy}/")) == len(traffic.jobs) + 2
        rows[policy] = summarize(policy, 0.5, traffic, spec, records, seconds, counts)
        assert rows[policy]["failed"] == 0 and rows[policy]["prompt_tokens"] == traffic.prompt_tokens
    assert rows["cache_aware"]["computed_tokens"] < rows["round_robin"]["computed_tokens"], rows
    assert rows["cache_aware"]["computed_tokens"] >= traffic.oracle_computed(spec.block_size) - len(traffic.jobs)
