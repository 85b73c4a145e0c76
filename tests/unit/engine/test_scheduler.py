from pdmesh.config import SchedulerConfig
from pdmesh.engine.scheduler import Scheduler, SchedulerOutput
from pdmesh.kv.block_hash import BlockHasher
from pdmesh.kv.block_pool import BlockPool
from pdmesh.kv.kv_cache_manager import KVCacheManager
from pdmesh.request import SeqStatus, Sequence
from pdmesh.sampling_params import SamplingParams


def make(num_blocks: int = 64, budget: int = 32, max_seqs: int = 8, chunk: int = 0) -> Scheduler:
    kv = KVCacheManager(BlockPool(num_blocks), BlockHasher(4))
    return Scheduler(SchedulerConfig(budget, max_seqs, chunk), kv)


def seq(sid: str, n: int, t: float = 0.0, priority: int = 0, start: int = 0) -> Sequence:
    toks = list(range(start, start + n))
    return Sequence(sid, sid, 0, SamplingParams(priority=priority), n, toks, t)


def plan(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled]


def sample_all(out: SchedulerOutput) -> None:
    for item in out.scheduled:
        if item.samples:
            item.seq.token_ids.append(7)


def test_chunked_prefill_under_token_budget_then_decode() -> None:
    s = make(budget=16)
    a, b = seq("a", 20), seq("b", 6, t=1, start=100)
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert plan(out) == [("a", 16)] and not out.scheduled[0].samples
    sample_all(out)
    out = s.schedule()
    assert plan(out) == [("a", 4), ("b", 6)]
    sample_all(out)
    assert plan(s.schedule()) == [("a", 1), ("b", 1)]


def test_long_prefill_threshold_caps_a_chunk() -> None:
    s = make(budget=32, chunk=8)
    s.add(seq("a", 20))
    s.add(seq("b", 4, t=1))
    assert plan(s.schedule()) == [("a", 8), ("b", 4)]


def test_priority_orders_admission() -> None:
    s = make(budget=4)
    s.add(seq("low", 4, t=0, priority=5))
    s.add(seq("high", 4, t=1, priority=-1))
    assert plan(s.schedule()) == [("high", 4)]


def test_preemption_takes_newest_admitted_and_recomputes() -> None:
    s = make(num_blocks=4, budget=64)  # 16 token slots
    a, b = seq("a", 8), seq("b", 8, t=1, start=100)
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert plan(out) == [("a", 8), ("b", 8)]
    sample_all(out)  # both need a third block for their 9th token: the pool has none
    out = s.schedule()
    assert [x.seq_id for x in out.preempted] == ["b"]
    assert plan(out) == [("a", 1)]
    assert b.status is SeqStatus.PREEMPTED and b.num_computed_tokens == 0
    sample_all(out)
    s.finish(a, SeqStatus.FINISHED_STOPPED)
    out = s.schedule()
    assert plan(out) == [("b", 9)]  # prompt + its generated token recomputed
    assert s.num_preemptions == 1


def test_preemption_victim_is_lowest_priority_first() -> None:
    s = make(num_blocks=4, budget=64)
    a, b = seq("a", 8, priority=3), seq("b", 8, t=1, start=100, priority=0)
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert plan(out) == [("b", 8), ("a", 8)]
    sample_all(out)
    out = s.schedule()
    assert [x.seq_id for x in out.preempted] == ["a"]


def test_abort_in_every_state_frees_blocks() -> None:
    s = make(budget=8)
    running, partial, waiting = seq("r", 4), seq("p", 12, t=1, start=50), seq("w", 4, t=2, start=90)
    for x in (running, partial, waiting):
        s.add(x)
    out = s.schedule()
    assert plan(out) == [("r", 4), ("p", 4)]
    for x in (running, partial, waiting):
        s.finish(x, SeqStatus.FINISHED_ABORTED)
    assert not s.has_unfinished() and s.kv.stats().used == 0 and s.num_waiting == 0


def test_prefix_hits_do_not_cost_budget() -> None:
    s = make(budget=16)
    a = seq("a", 13)
    s.add(a)
    out = s.schedule()
    s.kv.cache_blocks(a)
    s.finish(a, SeqStatus.FINISHED_STOPPED)
    b = seq("b", 13)
    s.add(b)
    out = s.schedule()
    assert plan(out) == [("b", 1)] and b.num_cached_tokens == 12


def test_waiting_sequence_defers_while_its_prefix_is_being_computed() -> None:
    s = make(budget=16)
    a, b = seq("a", 20), seq("b", 10, t=1)  # b's first two blocks are a's
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert plan(out) == [("a", 16)]
    s.kv.cache_blocks(a)  # the engine registers computed blocks after each step
    out = s.schedule()
    assert plan(out) == [("a", 4), ("b", 2)] and b.num_cached_tokens == 8


def test_a_prompt_budget_caps_prompt_tokens_but_not_decode_tokens() -> None:
    s = make(budget=32)
    a, b, c = seq("a", 4), seq("b", 20, t=1, start=100), seq("c", 20, t=2, start=200)
    s.add(a)
    sample_all(s.schedule())  # a decodes from now on
    s.add(b)
    s.add(c)
    out = s.schedule(prompt_budget=12)
    assert plan(out) == [("a", 1), ("b", 12)]  # 13 of 32: the prompt tokens stop at 12
    sample_all(out)
    out = s.schedule(prompt_budget=12)
    assert plan(out) == [("a", 1), ("b", 8), ("c", 4)]  # a running chunk and an admission share it
    sample_all(out)
    assert plan(s.schedule()) == [("a", 1), ("b", 1), ("c", 16)]  # no cap: the whole budget
