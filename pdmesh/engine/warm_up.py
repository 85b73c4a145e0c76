"""A served engine's first full prompt step, run before it takes traffic.

A fresh worker's first large prompt step pays for memory it touches for the first time:
the activations of a 2,048-token step are tens of MiB, which the allocator takes from the
kernel page by page (``pdmesh/allocator.py`` then keeps them). Measured on 2 cores (the
default 40M model, 1 prefill + 1 decode worker, a burst of 32 prompts sharing 4
prefixes), a worker's first two prompt steps took 3,900-5,900 minor page faults each
(0.04-0.08 s of system time, about a tenth of the step); the same steps in a warm process
took a handful (docs/performance/log.md §29). A long-running server pays that once; a user
who starts a mesh and sends it a burst paid it on the burst's first tokens.

So a worker runs one prompt of the step's token budget (and one decode step after it)
before it reports itself serving, as vLLM does with its dummy runs. The prompt is
computed with prefix caching off, so no block of it is cached, published to the index or
counted; every block it took is free again when ``warm_up`` returns. It holds the
machine's measurement lock shared (``pdmesh/measure_lock.py``): a second of full-core work
beside another worker's start-up probe of its linear products would skew that probe, while
warm-ups may run beside each other.
"""

from __future__ import annotations

import contextlib
import resource
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdmesh.engine.step_cost import TokenCost
from pdmesh.errors import UnknownRequestError
from pdmesh.measure_lock import not_while_measuring
from pdmesh.sampling_params import SamplingParams
from pdmesh.startup import set_phase

if TYPE_CHECKING:
    from pdmesh.engine.llm_engine import LLMEngine

REQUEST_ID = "pdmesh-warm-up"
_MAX_STEPS = 64
"""A 2-token request needs a few steps; more means something is wrong, not slow."""


@dataclass(frozen=True)
class WarmUp:
    prompt_tokens: int
    seconds: float
    page_faults: int
    """Minor page faults the process took meanwhile (memory touched for the first time)."""


def warm_up_tokens(engine: LLMEngine, wanted: int) -> int:
    """The prompt length a warm-up may use: ``wanted`` (or, when negative, the step's token
    budget), within the context limit and with room for the prompt and one more token in
    the KV pool."""
    budget = engine.config.scheduler.max_num_batched_tokens if wanted < 0 else wanted
    pool_tokens = (engine.pool.num_blocks - 1) * engine.kv.block_size
    return max(0, min(budget, engine.max_model_len - 2, pool_tokens - 2))


def warm_up(engine: LLMEngine, wanted: int = -1) -> WarmUp | None:
    """Compute one prompt of ``warm_up_tokens(engine, wanted)`` tokens and one decode step,
    before any request arrives (an engine with a request in it is refused). None when
    there is nothing to run (0 tokens)."""
    tokens = warm_up_tokens(engine, wanted)
    if tokens <= 0:
        return None
    if engine.has_unfinished_requests():
        raise RuntimeError("warm_up runs before the engine takes requests")
    set_phase(f"warming up (a {tokens}-token prompt)")
    vocab = engine.model_config.vocab_size
    prompt = [1 + i % (vocab - 1) for i in range(tokens)]
    with not_while_measuring("the warm-up"):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        _run(engine, prompt)
        seconds = time.perf_counter() - started
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    engine.prefill_cost = TokenCost()  # a first step's time is not what a token costs
    return WarmUp(tokens, seconds, faults)


def _run(engine: LLMEngine, prompt: list[int]) -> None:
    """The warm-up request to its end, with prefix caching off; freed whatever happens."""
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, output_kind="final_only")
    caching, engine.pool.enable_caching = engine.pool.enable_caching, False
    try:
        engine.add_request(REQUEST_ID, prompt, params)
        for _ in range(_MAX_STEPS):
            if not engine.has_unfinished_requests():
                break
            engine.step()
        else:
            raise RuntimeError(f"the warm-up request did not finish in {_MAX_STEPS} steps")
    finally:
        if engine.has_unfinished_requests():  # a failed step: free what it holds
            with contextlib.suppress(UnknownRequestError):
                engine.abort_request(REQUEST_ID)
            engine.take_ready_outputs()
        engine.pool.enable_caching = caching
