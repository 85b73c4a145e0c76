"""Request lifecycle: aborts at random points, validation, streaming — never a leaked block."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from pdmesh.engine.async_engine import AsyncLLMEngine
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.errors import InvalidRequestError, UnknownRequestError
from pdmesh.sampling_params import SamplingParams
from tests.oracle import mixed_prompts


@pytest.fixture(scope="module")
def engine(llama_dir: Path) -> LLMEngine:
    return LLMEngine.from_model(str(llama_dir), dtype="float32", max_model_len=512)


def assert_no_leak(engine: LLMEngine) -> None:
    s = engine.stats()
    assert not engine.has_unfinished_requests()
    assert s.used == 0 and s.free + s.cached == s.num_blocks
    assert engine.kv.num_sequences() == 0


def test_random_aborts_over_200_requests_leave_no_block_in_use(llama_dir: Path) -> None:
    # A small pool so that preemption, copy-on-write (n > 1) and eviction all happen.
    from pdmesh.config import CacheConfig, EngineConfig, SchedulerConfig

    engine = LLMEngine(EngineConfig(
        model=str(llama_dir), dtype="float32",
        cache=CacheConfig(block_size=4, num_blocks=96),
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16),
    ))
    rng = random.Random(0)
    prompts = mixed_prompts(200, seed=4)
    live: set[str] = set()
    finished: dict[str, str | None] = {}
    aborted = 0
    next_id = 0
    while next_id < 200 or engine.has_unfinished_requests():
        for _ in range(rng.randrange(0, 4)):
            if next_id < 200:
                params = SamplingParams(
                    temperature=rng.choice([0.0, 0.8]), max_tokens=rng.randrange(1, 24),
                    n=rng.choice([1, 1, 2]), seed=rng.randrange(100), output_kind="delta",
                    top_k=rng.choice([0, 20]), top_p=rng.choice([1.0, 0.9]),
                    repetition_penalty=rng.choice([1.0, 1.2]),
                    presence_penalty=rng.choice([0.0, 0.5]), logprobs=rng.choice([None, 2]),
                )
                engine.add_request(f"r{next_id}", prompts[next_id][:120], params)
                live.add(f"r{next_id}")
                next_id += 1
        if live and rng.random() < 0.3:
            victim = rng.choice(sorted(live))
            engine.abort_request(victim)
            aborted += 1
        for out in engine.step():
            if out.finished:
                live.discard(out.request_id)
                finished[out.request_id] = out.outputs[0].finish_reason if out.outputs else None
        live -= {rid for rid, _ in finished.items()}
    assert len(finished) == 200
    assert sum(1 for r in finished.values() if r == "abort") == aborted > 20
    assert engine.scheduler.num_preemptions > 0
    assert_no_leak(engine)
    with pytest.raises(UnknownRequestError):
        engine.abort_request("r0")


@pytest.mark.parametrize(
    ("prompt", "options", "field"),
    [
        ("", {}, "prompt"),
        ([], {}, "prompt"),
        ([5, 100000], {}, "prompt"),
        ([5, -1], {}, "prompt"),
        ([7] * 512, {}, "prompt"),
        ([7] * 10, {"max_tokens": 10**6, "stop_token_ids": (5,)}, "max_tokens"),
        ([7] * 10, {"stop_token_ids": (99999,)}, "stop_token_ids"),
        ("hi", {"top_p": 2}, "top_p"),
        ("hi", {"bogus_option": 1}, "bogus_option"),
    ],
)
def test_bad_requests_raise_one_typed_error(engine: LLMEngine, prompt, options, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("bad", prompt, options)
    assert err.value.field == field
    assert_no_leak(engine)


def test_duplicate_request_id_is_rejected(engine: LLMEngine) -> None:
    engine.add_request("dup", "hello", {"max_tokens": 2})
    with pytest.raises(InvalidRequestError, match="already in flight"):
        engine.add_request("dup", "hello", {"max_tokens": 2})
    while engine.has_unfinished_requests():
        engine.step()
    assert_no_leak(engine)


def test_stop_strings_and_min_tokens_end_generation(engine: LLMEngine) -> None:
    prompt = mixed_prompts(3, seed=2)[2]
    full = _run(engine, prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    text = full.outputs[0].text
    stop = text[10:14]
    cut = _run(engine, prompt, SamplingParams(temperature=0, max_tokens=30, stop=(stop,), ignore_eos=True))
    c = cut.outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == stop
    assert c.text == text[: text.index(stop)]
    capped = _run(engine, prompt, SamplingParams(temperature=0, max_tokens=5))
    assert capped.outputs[0].finish_reason == "length" and len(capped.outputs[0].token_ids) == 5
    assert_no_leak(engine)


def _run(engine: LLMEngine, prompt, params):  # type: ignore[no-untyped-def]
    engine.add_request("one", prompt, params.replace(output_kind="final_only"))
    result = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            result = out
    return result


def test_async_streams_deltas_and_cancellation_frees_blocks(engine: LLMEngine) -> None:
    async def main() -> None:
        async_engine = AsyncLLMEngine(engine)
        prompts = mixed_prompts(6, seed=7)
        params = SamplingParams(temperature=0, max_tokens=12, output_kind="delta", ignore_eos=True)

        async def collect(i: int) -> tuple[list[int], str]:
            toks: list[int] = []
            text = ""
            async for out in async_engine.generate(prompts[i], params, request_id=f"s{i}"):
                toks += out.outputs[0].token_ids
                text += out.outputs[0].text
            return toks, text

        async def cancel_midway() -> None:
            seen = 0
            async for _ in async_engine.generate(prompts[0], params.replace(max_tokens=200), request_id="c"):
                seen += 1
                if seen == 3:
                    break

        results = await asyncio.gather(*(collect(i) for i in range(6)), cancel_midway())
        final = engine.tokenizer.decode
        for toks, text in results[:6]:
            assert len(toks) == 12 and text == final(toks)
        with pytest.raises(InvalidRequestError):
            async for _ in async_engine.generate("", params):
                pass
        for _ in range(100):
            if not engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)
        await async_engine.shutdown()

    asyncio.run(main())
    assert_no_leak(engine)


def test_a_stopped_engine_leaves_its_cores_to_its_peers(engine: LLMEngine, tmp_path: Path) -> None:
    """``shutdown`` releases the engine's slot idle, whether or not it had gone idle
    itself: a peer on the same machine takes both shares from its next step on."""
    from pdmesh.engine.core_share import CoreShare, create_share_file

    path = tmp_path / "cores"
    create_share_file(path, 2)
    peer_threads: list[int] = []
    peer = CoreShare(path, 1, 1, 2, peer_threads.append)

    async def main() -> None:
        async_engine = AsyncLLMEngine(engine)
        async_engine.core_share = CoreShare(path, 0, 1, 2, lambda n: None)
        params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        async for _ in async_engine.generate(mixed_prompts(1, seed=3)[0], params, request_id="cores"):
            pass
        share = async_engine.core_share
        await async_engine.shutdown()
        assert async_engine.core_share is None and share.closed  # released, its slot left idle

    asyncio.run(main())
    assert peer.busy() == 2
    assert peer_threads == [2]
