from pdmesh.kv.block_hash import BlockHasher
from pdmesh.mesh_types import WorkerInfo
from pdmesh.sampling_params import SamplingParams
from services.router.policies.base import RouteContext
from services.router.policies.least_loaded import LeastLoadedPolicy
from services.router.policies.prefix_hash import rendezvous_pick, ring_pick
from services.router.policies.round_robin import RoundRobinPolicy
from services.router.recent import RecentRoutes
from services.router.worker_handle import WorkerHandle

HASHES = BlockHasher(4).hash_tokens(list(range(40)))


def workers(n: int, loads: list[int] | None = None) -> list[WorkerHandle]:
    out = []
    for i in range(n):
        w = WorkerHandle(f"127.0.0.1:{9000 + i}", "prefill", healthy=True)
        w.info = WorkerInfo(worker_id=f"p{i}", free_blocks=100 - i)
        w.in_flight = (loads or [0] * n)[i]
        out.append(w)
    return out


def ctx(matched: dict[str, int] | None, tier: int = 0) -> RouteContext:
    return RouteContext(HASHES, HASHES[0], matched, 4, tier)


def test_rendezvous_moves_only_the_departed_workers_keys() -> None:
    keys = BlockHasher(4).hash_tokens(list(range(4000)))
    four, three = workers(4), workers(4)[:3]
    before = [rendezvous_pick(four, k).worker_id for k in keys]
    after = [rendezvous_pick(three, k).worker_id for k in keys]
    moved = sum(b != a for b, a in zip(before, after))
    assert moved == sum(b == "p3" for b in before)
    assert 0.15 < moved / len(keys) < 0.35


def test_prefix_hash_moves_few_keys_when_a_worker_leaves() -> None:
    keys = [h for h in BlockHasher(4).hash_tokens(list(range(4000)))]
    four, three = workers(4), workers(4)[:3]
    before = [ring_pick(four, k).worker_id for k in keys]
    after = [ring_pick(three, k).worker_id for k in keys]
    moved = sum(b != a for b, a in zip(before, after))
    assert moved == sum(b == "p3" for b in before)  # only the departed worker's keys move
    assert 0.1 < moved / len(keys) < 0.4


def test_least_loaded_and_round_robin() -> None:
    ws = workers(3, [2, 1, 1])
    assert LeastLoadedPolicy().choose(ws, ctx(None)).worker.worker_id == "p1"  # more free blocks
    rr = RoundRobinPolicy()
    assert [rr.choose(ws, ctx(None)).worker.worker_id for _ in range(4)] == ["p0", "p1", "p2", "p0"]


def test_recent_routes_predict_the_prefix_before_the_index_knows() -> None:
    recent = RecentRoutes()
    recent.remember(HASHES[:6], "p1")
    assert recent.depths(HASHES) == {"p1": 6}
    assert recent.depths(BlockHasher(4, seed=1).hash_tokens(list(range(40)))) == {}
    recent.remember(HASHES[:3], "p2")
    assert recent.depths(HASHES) == {"p2": 3}
    assert RecentRoutes(ttl_s=0.0).depths(HASHES) == {}


def test_recent_routes_know_which_routing_keys_came_by_before() -> None:
    recent = RecentRoutes(max_keys=2)
    assert [recent.recurs(k) for k in (b"a", b"a", b"b", b"a")] == [False, True, False, True]
    recent.recurs(b"c")  # three keys: the least recently seen ("b") is forgotten
    assert (recent.recurs(b"b"), recent.recurs(b"c")) == (False, True)


def test_load_ignores_a_queue_length_older_than_our_last_completion() -> None:
    import time
    from dataclasses import replace

    w = workers(1)[0]
    w.info = replace(w.info, num_waiting=1)  # type: ignore[arg-type]
    w.info_at = time.monotonic()
    assert w.load == 1
    w.acquire()
    assert w.load == 2
    w.release()  # our request finished after that Info was taken: its queue entry may be ours
    assert w.load == 0
    w.info_at = time.monotonic()
    assert w.load == 1


def test_local_prefill_reasons(llama_dir) -> None:  # type: ignore[no-untyped-def]
    from services.router.config import RouterConfig
    from services.router.policies.base import Decision
    from services.router.registry import Registry
    from services.router.router import Router

    cfg = RouterConfig(model=str(llama_dir), local_prefill_tokens=32, prefill_busy_requests=2)
    router = Router(cfg, Registry(cfg))
    w = workers(1)[0]
    long_prompt = list(range(100))
    assert router.local_reason(Decision(w, "miss", 0), long_prompt) == ""
    # Short by what the decode worker would compute: 20 tokens beyond the 80 it holds ...
    assert router.local_reason(Decision(w, "miss", 0), long_prompt, decode_held=80) == "short_prompt"
    assert router.local_reason(None, long_prompt[:20]) == "no_prefill"
    assert router.local_reason(Decision(w, "miss", 0), long_prompt[:20]) == "short_prompt"
    # ... not by what the prefill worker holds: the decode worker would compute all 100.
    assert router.local_reason(Decision(w, "hit", 80), long_prompt) == ""
    w.in_flight = 2
    assert router.local_reason(Decision(w, "miss", 0), long_prompt) == "prefill_busy"
    assert router.local_reason(None, long_prompt) == "no_prefill"


def test_under_conditional_disaggregation_a_prompt_follows_its_prefix(llama_dir) -> None:  # type: ignore[no-untyped-def]
    """Spilled by the busy rule, a prompt whose prefix is on its way from the prefill
    worker would compute that prefix again on the decode worker: a burst sharing four
    512-token prefixes cached 0.69 of its tokens against 0.78 (docs/performance/log.md §14)."""
    from services.router.config import FOLLOW_LIMIT, RouterConfig
    from services.router.policies.base import Decision
    from services.router.registry import Registry
    from services.router.router import Router

    cfg = RouterConfig(model=str(llama_dir), prefill_busy_requests=4, prefill_busy_tokens=1000)
    router = Router(cfg, Registry(cfg))
    w = workers(1)[0]
    prompt = list(range(600))
    # Cold prompts: the work queued there decides, in requests or in tokens.
    assert router.local_reason(Decision(w, "miss", 0), prompt) == ""
    w.pending_tokens = 1000
    assert router.local_reason(Decision(w, "miss", 0), prompt) == "prefill_busy"
    # The decode worker was sent more of the prompt: prefill there, whatever the load.
    w.pending_tokens = 0
    assert router.local_reason(Decision(w, "miss", 0), prompt, decode_held=512) == "decode_holds"
    assert router.local_reason(Decision(w, "hit", 256), prompt, decode_held=512) == "decode_holds"
    # The prefill worker holds at least as much: follow it, past the busy rule ...
    w.pending_tokens, w.in_flight = 2000, 6
    assert router.local_reason(Decision(w, "hit", 512), prompt, decode_held=512) == ""
    # ... until it is FOLLOW_LIMIT times past it.
    w.pending_tokens = int(FOLLOW_LIMIT * 1000)
    assert router.local_reason(Decision(w, "hit", 512), prompt, decode_held=512) == "prefill_busy"
    w.pending_tokens, w.in_flight = 0, int(FOLLOW_LIMIT * 4)
    assert router.local_reason(Decision(w, "hit", 512), prompt) == "prefill_busy"
    # Busy, but the decode worker's queue plus this prompt is no shorter: the prompt stays
    # (a burst otherwise sent everything past the rule to the decode worker).
    d = WorkerHandle("127.0.0.1:9100", "decode", healthy=True)
    w.pending_tokens, w.in_flight, d.pending_tokens = 1000, 0, 1000
    assert router.local_reason(Decision(w, "miss", 0), prompt, decode=d) == ""
    d.pending_tokens = 999
    assert router.local_reason(Decision(w, "miss", 0), prompt, decode=d) == "prefill_busy"
    # Without conditional disaggregation nothing of this applies.
    plain = Router(RouterConfig(model=str(llama_dir)), Registry(cfg))
    assert plain.local_reason(Decision(w, "miss", 0), prompt, decode_held=512) == ""


def test_a_prompt_is_remembered_on_the_prefill_worker_only_if_it_goes_there(llama_dir) -> None:  # type: ignore[no-untyped-def]
    from services.router.config import RouterConfig
    from services.router.policies.base import Decision
    from services.router.registry import Registry
    from services.router.router import Router

    cfg = RouterConfig(model=str(llama_dir), prefill_busy_requests=2)
    router = Router(cfg, Registry(cfg))
    w = workers(1)[0]
    local, remote = router.prompt_hashes(list(range(64)), SamplingParams()), router.prompt_hashes(
        list(range(100, 164)), SamplingParams())
    router.settle_route(Decision(w, "miss", 0), "prefill_busy", local)
    router.settle_route(Decision(w, "miss", 0), "", remote)
    recent = router.prefill_router.recent
    assert recent.depths(local) == {} and recent.depths(remote) == {w.worker_id: len(remote)}
    assert router.stats.local_prefills == 1 and router.stats.decisions["local/prefill_busy"] == 1


def test_holder_keeps_a_conversation_on_its_decode_worker_within_the_slack() -> None:
    from services.router.policies.holder import HolderPolicy

    policy = HolderPolicy(slack=2)
    ws = workers(3, loads=[3, 1, 5])
    held = RouteContext(HASHES, HASHES[0], {"p0": 3, "p2": 4}, 4)
    choice = policy.choose(ws, held)
    assert (choice.worker.worker_id, choice.reason, choice.cached_tokens) == ("p0", "holder", 12)
    ws[0].in_flight = 4  # 3 more than the least loaded: beyond the slack
    assert policy.choose(ws, held).worker.worker_id == "p1"
    assert policy.choose(ws, RouteContext(HASHES, HASHES[0], {}, 4)).reason == "load"  # nobody holds it


def test_the_router_remembers_where_a_conversation_decoded(llama_dir) -> None:  # type: ignore[no-untyped-def]
    from services.router.config import RouterConfig
    from services.router.registry import Registry
    from services.router.router import Router

    cfg = RouterConfig(model=str(llama_dir))
    router = Router(cfg, Registry(cfg))
    ds = workers(2, loads=[0, 0])
    for w in ds:
        w.role = "decode"
    router.workers.workers = ds
    turn1 = list(range(10, 10 + 4 * cfg.block_size))
    first, held = router.route_decode(router.prompt_hashes(turn1, SamplingParams()))
    assert held == 0  # nothing of it was sent anywhere before
    other = next(w for w in ds if w is not first)
    first.in_flight = 1  # busier than the other by one: within the slack
    turn2 = turn1 + list(range(500, 500 + 2 * cfg.block_size))
    again, held = router.route_decode(router.prompt_hashes(turn2, SamplingParams()))
    assert again is first and held == len(turn1)  # turn 1 went there: 4 full blocks
    assert router.stats.decisions["decode/holder"] == 1
    stranger = list(range(700, 700 + 4 * cfg.block_size))
    assert router.route_decode(router.prompt_hashes(stranger, SamplingParams()))[0] is other  # least loaded
    assert router.route_decode(router.prompt_hashes(turn2, SamplingParams()), exclude={first.worker_id})[0] is other


def test_pack_fills_one_decode_workers_batch_before_the_next() -> None:
    from dataclasses import replace

    from services.router.policies.pack import PackPolicy

    policy = PackPolicy()
    ws = workers(3)
    for w, limit in zip(ws, (2, 2, 0)):
        w.info = replace(w.info, max_num_seqs=limit)  # p2: an older worker, its limit unknown
    ws.reverse()  # the order candidates come in does not matter: the worker id does
    nobody = RouteContext(HASHES, HASHES[0], {}, 4)
    chosen = []
    for _ in range(4):
        choice = policy.choose(ws, nobody)
        choice.worker.in_flight += 1
        chosen.append((choice.worker.worker_id, choice.reason))
    assert chosen == [("p0", "pack"), ("p0", "pack"), ("p1", "pack"), ("p1", "pack")]
    # Every batch full: the least loaded takes it and queues it (p2 has no request yet).
    assert (policy.choose(ws, nobody).worker.worker_id, policy.choose(ws, nobody).reason) == ("p2", "load")
    # Room again on p1: among workers with room, the one holding the conversation wins
    # over the first in order; a holder without room does not.
    ws[1].in_flight = 1  # p1 (the list is reversed)
    ws[2].in_flight = 0  # p0
    held = RouteContext(HASHES, HASHES[0], {"p1": 3}, 4)
    assert (policy.choose(ws, held).worker.worker_id, policy.choose(ws, held).reason,
            policy.choose(ws, held).cached_tokens) == ("p1", "holder", 12)
    ws[1].in_flight = 2
    assert policy.choose(ws, held).worker.worker_id == "p0"


def test_a_prompt_no_prefill_pool_holds_goes_where_it_fits(llama_dir) -> None:  # type: ignore[no-untyped-def]
    """Pools are sized per worker (a prefill worker's is often the smaller): a prompt that
    fits no prefill worker prefills on a decode worker that holds it, instead of failing
    with "shorten the prompt"; among decode workers, one whose pool holds it is chosen."""
    import asyncio
    from dataclasses import replace

    import pytest

    from pdmesh.errors import InvalidRequestError
    from services.router.config import RouterConfig
    from services.router.registry import Registry
    from services.router.router import Router

    cfg = RouterConfig(model=str(llama_dir))
    router = Router(cfg, Registry(cfg))
    small, large = workers(2)
    small.info = replace(small.info, num_blocks=8, block_size=16)  # 128 tokens
    large.info = replace(large.info, num_blocks=16, block_size=16)  # 256
    router.workers.workers = [small, large]
    fits_one = list(range(10, 10 + 200))
    assert small.holds(128) and not small.holds(129) and large.holds(201)

    choice, _ = asyncio.run(router.route_prefill(fits_one, router.prompt_hashes(fits_one, SamplingParams()), set()))
    assert choice is not None and choice.worker is large  # the only candidate that holds it
    assert router.local_reason(choice, fits_one) == ""

    fits_none = list(range(10, 10 + 300))
    hashes = router.prompt_hashes(fits_none, SamplingParams())
    choice, _ = asyncio.run(router.route_prefill(fits_none, hashes, set()))
    assert choice is None
    assert router.local_reason(None, fits_none) == "too_long_for_prefill"
    assert router.local_reason(None, fits_one) == "no_prefill"  # excluded after failures: not too long
    strict = Router(replace(cfg, disaggregation="strict"), router.workers)
    with pytest.raises(InvalidRequestError, match=r"300 tokens do not fit any prefill worker \(.* has 255\)"):
        strict.local_reason(None, fits_none)

    # A context set shorter than the model's (--max-model-len) rules a worker out the same way.
    large.info = replace(large.info, max_model_len=150)
    assert large.capacity == 150 and not large.holds(151)
    assert asyncio.run(router.route_prefill(fits_one, router.prompt_hashes(fits_one, SamplingParams()), set()))[0] is None
    assert router.local_reason(None, fits_one) == "too_long_for_prefill"
    large.info = replace(large.info, max_model_len=0)  # an older worker: its pool alone says

    d_small, d_large = workers(2)
    for w, blocks in ((d_small, 16), (d_large, 64)):
        w.role, w.info = "decode", replace(w.info, worker_id=f"d{blocks}", num_blocks=blocks, block_size=16)
    d_large.in_flight = 5  # the busier one, chosen only because it alone holds the request
    router.workers.workers = [small, large, d_small, d_large]
    assert router.route_decode(hashes, tokens=300 + 16)[0] is d_large
    assert router.route_decode(hashes, tokens=100)[0] is d_small
    # None holds it: any is chosen, and its own admission answers INVALID_ARGUMENT.
    assert router.route_decode(hashes, tokens=64 * 16 + 1)[0] in (d_small, d_large)
