"""``pdmesh bench profile``: where one engine step spends its time, by operator.

Builds the engine, fills ``batch`` sequences with ``context``-token prompts, then times
pure decode steps (and, separately, one prefill step of ``batch`` x ``prefill`` tokens)
under ``torch.profiler``; prints the top operators by self CPU time and the mean step.
This is the profile docs/performance/log.md is written from.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.sampling_params import SamplingParams


def _fill(engine: LLMEngine, batch: int, context: int, max_tokens: int) -> None:
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, output_kind="final_only")
    for i in range(batch):
        engine.add_request(f"p{i}", [rng.randrange(10, 1000) for _ in range(context)], params)


def run_to_decode(engine: LLMEngine, warmup: int = 0) -> None:
    """Step until every sequence is past its prefill, then ``warmup`` more (decode) steps."""
    while any(s.is_prefill for s in engine.scheduler.running) or engine.scheduler.num_waiting:
        engine.step()
    for _ in range(warmup):
        engine.step()


def decode_step_times(engine: LLMEngine, steps: int, warmup: int = 0) -> list[float]:
    """Seconds of each of ``steps`` pure decode steps (every sequence past its prefill),
    after ``warmup`` untimed ones (``run_to_decode``): the one timing loop this profile and
    the step-cost scripts in scripts/ share."""
    run_to_decode(engine, warmup)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return times


def run_profile(args: argparse.Namespace) -> None:
    from pdmesh.cli.options import config_from_args, resolve_model_field
    from pdmesh.config import EngineArgs

    engine = LLMEngine(resolve_model_field(config_from_args(args, EngineArgs, None)).engine_config())
    print(f"pdmesh bench profile — {args.model}, dtype {engine.dtype}, {torch.get_num_threads()} threads, "
          f"attention {type(engine.runner.backend).__name__}")
    _fill(engine, args.batch, args.context, args.steps * 3 + 8)
    mean = statistics.mean(decode_step_times(engine, args.steps, warmup=2))
    print(f"decode step, batch {args.batch}, ~{args.context}-token contexts: {1000 * mean:.1f} ms "
          f"({args.batch / mean:.0f} tok/s)")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        decode_step_times(engine, args.steps)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    for rid in [f"p{i}" for i in range(args.batch)]:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    engine.pool.reset_prefix_cache()
    _fill(engine, args.batch, args.prefill, 1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        seconds = time.perf_counter() - start
    print(f"prefill {args.batch} x {args.prefill} tokens: {seconds:.2f} s "
          f"({args.batch * args.prefill / seconds:.0f} tok/s)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
