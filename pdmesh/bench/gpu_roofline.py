"""``pdmesh bench engine --device cuda``: the engine on a GPU against the GPU's own ceilings.

A GPU engine is judged against what the chip can do, measured in the same run:
- the copy ceiling: a device-to-device copy of a buffer far past L2, counting the bytes
  read and written;
- the matrix ceiling: a large bf16 matrix product on random data.
Decode is memory-bound: each step reads the weights (all but the embedding, of which it
reads one row per sequence) and every sequence's KV, so its achieved bandwidth is those
bytes over the step time, a fraction of the copy ceiling. Prefill at 2k tokens is
compute-bound: its FLOPs (2 per weight per token, plus causal attention) over its time
are a fraction of the matrix ceiling. ``transformers``' ``generate`` on the same GPU, same
weights, is the baseline at one batch size (its decode time net of its prefill).

Decode rows time whole engine steps (scheduling, sampling, detokenizing included), after
every sequence has its first token, so the figure is what a user's stream sees.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from pdmesh.bench.stats import around_calls, median_seconds
from pdmesh.config import EngineConfig
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.sampling_params import SamplingParams


@dataclass
class Ceilings:
    copy_gb_s: float
    """Device-to-device copy, bytes read + written per second / 1e9."""
    matmul_tflop_s: float
    """bf16 (or the engine's dtype) matrix product on random data."""


@dataclass
class DecodeRow:
    batch: int
    context: int
    step_ms: float
    tok_s: float
    """Tokens the timed steps produced, per second."""
    bytes_per_step_gb: float
    bandwidth_gb_s: float
    of_copy: float
    """Achieved bandwidth / the copy ceiling, over whole engine steps."""
    forward_ms: float | None
    """The model's forward alone (GPU time): the rest of a step is the host's."""
    forward_of_copy: float | None
    tokens: int
    """Tokens produced in the timed steps (batch x steps)."""
    hf_tok_s: float | None = None

    @property
    def vs_hf(self) -> float | None:
        return self.tok_s / self.hf_tok_s if self.hf_tok_s else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_ceilings(device: torch.device, dtype: torch.dtype, copy_bytes: int, n: int) -> Ceilings:
    """The copy ceiling on ``copy_bytes`` (read, and as many written) and the matrix
    ceiling on n x n x n products of random ``dtype`` data."""
    return Ceilings(2 * copy_bytes / _copy_seconds(device, copy_bytes) / 1e9,
                    2 * n**3 / _matmul_seconds(device, dtype, n) / 1e12)


def _copy_seconds(device: torch.device, nbytes: int) -> float:
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return median_seconds(lambda: dst.copy_(src), sync=lambda: _sync(device))


def _matmul_seconds(device: torch.device, dtype: torch.dtype, n: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return median_seconds(lambda: torch.mm(a, b), sync=lambda: _sync(device))


def _prompts(n: int, length: int, rng: random.Random, vocab: int) -> list[list[int]]:
    return [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(n)]


def weight_bytes_per_step(engine: LLMEngine) -> int:
    """Bytes of weights a decode step reads: every parameter but the input embedding (a
    tied LM head reads it whole, and then it counts)."""
    model = engine.runner.model
    skip = model.embed.weight if model.lm_head is not None else None
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not skip)


def kv_bytes_per_token(engine: LLMEngine) -> int:
    cfg = engine.model_config
    return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * engine.dtype.itemsize


@dataclass
class DecodeTiming:
    step_s: float
    """Wall seconds per engine step."""
    forward_s: float | None
    """GPU seconds per step of the model's forward alone (CUDA events), where measurable."""
    tokens: int
    """Tokens the timed steps produced: batch x steps, as every sequence decodes in each."""
    mean_context: float
    """Mean tokens per sequence over the timed steps (each step's KV read)."""


def time_decode(engine: LLMEngine, prompts: list[list[int]], steps: int, max_model_len: int) -> DecodeTiming:
    """Decode steps of all ``len(prompts)`` sequences at once, timed over ``steps`` steps
    once every sequence has its first token. The first prompts start decoding while the
    last still prefill, so no request may end before the timed steps do: each may run to
    the context's end, and all are aborted after the timing."""
    device = engine.runner.device
    budget = max_model_len - max(len(p) for p in prompts)
    params = SamplingParams(temperature=0, max_tokens=budget, ignore_eos=True, output_kind="delta")
    ids = [f"d{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, params)
    started: set[str] = set()
    while len(started) < len(ids):
        started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
    running = list(engine.scheduler.running)
    if len(running) != len(prompts) or engine.scheduler.num_waiting:
        raise RuntimeError(f"{len(running)} of {len(prompts)} sequences decode together: the KV pool is too small")
    if max(s.num_tokens for s in running) + steps >= max_model_len:
        raise RuntimeError(f"max_model_len {max_model_len} leaves too few tokens to time {steps} decode steps")
    context = sum(s.num_tokens for s in running) / len(running) + steps / 2
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def on_gpu(forward):
        def run(step):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            result = forward(step)
            end.record()
            events.append((begin, end))
            return result
        return run

    tokens = 0
    timing = around_calls(engine.runner, "forward", on_gpu) if device.type == "cuda" else contextlib.nullcontext()
    with timing:
        _sync(device)
        begin = time.perf_counter()
        for _ in range(steps):
            tokens += sum(len(o.outputs[0].token_ids) for o in engine.step())
        _sync(device)
        seconds = time.perf_counter() - begin
    forward_s = sum(b.elapsed_time(e) for b, e in events) / 1e3 / steps if events else None
    for rid in ids:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    return DecodeTiming(seconds / steps, forward_s, tokens, context)


def time_prefill(engine: LLMEngine, prompt: list[int]) -> float:
    """Seconds of the one engine step that computes ``prompt`` whole (its first token)."""
    device = engine.runner.device
    engine.add_request("p", prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    _sync(device)
    begin = time.perf_counter()
    engine.step()
    _sync(device)
    seconds = time.perf_counter() - begin
    while engine.has_unfinished_requests():
        engine.step()
    engine.pool.reset_prefix_cache()
    return seconds


def prefill_flops(engine: LLMEngine, tokens: int) -> float:
    """2 FLOPs per weight per token through the body, the LM head for the last token, and
    causal attention (QK^T and PV over ~tokens/2 keys on average)."""
    cfg = engine.model_config
    body = weight_bytes_per_step(engine) // engine.dtype.itemsize - cfg.vocab_size * cfg.hidden_size
    attention = 2 * 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * tokens * tokens / 2
    return 2 * body * tokens + 2 * cfg.vocab_size * cfg.hidden_size + attention


def _hf_decode_tok_s(hf, prompts: list[list[int]], new: int, device: torch.device) -> float:
    ids = torch.tensor(prompts, device=device)
    mask = torch.ones_like(ids)

    def gen(n: int) -> float:
        _sync(device)
        begin = time.perf_counter()
        hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
        _sync(device)
        return time.perf_counter() - begin

    gen(2)  # warm-up
    return len(prompts) * (new - 1) / (gen(new) - gen(1))


def run_gpu_bench(args: argparse.Namespace, engine_config: EngineConfig) -> dict:
    quick = bool(args.quick)
    batches = (1, 16) if quick else (1, 16, 64, 128)
    contexts = (128, 256) if quick else (1024, 4096)
    hf_batch = 16 if quick else 64
    steps = 8 if quick else 32
    prefill_len = 256 if quick else 2048
    engine = LLMEngine(engine_config)
    device, dtype = engine.runner.device, engine.dtype
    ceilings = measure_ceilings(device, dtype, (64 << 20) if quick else (4 << 30), 1024 if quick else 8192)
    vocab = engine.model_config.vocab_size
    rng = random.Random(0)
    weights, per_token = weight_bytes_per_step(engine), kv_bytes_per_token(engine)
    time_decode(engine, _prompts(2, 32, rng, vocab), 2, engine.max_model_len)  # warm-up
    rows: list[DecodeRow] = []
    hf_prompts: dict[int, list[list[int]]] = {}
    for context in contexts:
        for batch in batches:
            prompts = _prompts(batch, context, rng, vocab)
            if batch == hf_batch:
                hf_prompts[context] = prompts
            t = time_decode(engine, prompts, steps, engine.max_model_len)
            engine.pool.reset_prefix_cache()
            step_bytes = weights + batch * t.mean_context * per_token
            bw = step_bytes / t.step_s / 1e9
            fwd = step_bytes / t.forward_s / 1e9 / ceilings.copy_gb_s if t.forward_s else None
            rows.append(DecodeRow(batch, context, t.step_s * 1e3, t.tokens / (t.step_s * steps), step_bytes / 1e9,
                                  bw, bw / ceilings.copy_gb_s, t.forward_s * 1e3 if t.forward_s else None, fwd,
                                  t.tokens))
    prefill_s = statistics.median(time_prefill(engine, _prompts(1, prefill_len, rng, vocab)[0]) for _ in range(5))
    flops = prefill_flops(engine, prefill_len)
    prefill = {"tokens": prefill_len, "seconds": prefill_s, "tok_s": prefill_len / prefill_s,
               "tflop_s": flops / prefill_s / 1e12, "of_matmul": flops / prefill_s / 1e12 / ceilings.matmul_tflop_s}
    graphs = engine.runner.graphs is not None
    backend = type(engine.runner.backend).__name__
    del engine
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if not args.no_hf:
        from transformers import AutoModelForCausalLM

        loaded: Any = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)  # transformers' stubs lose .to()
        hf = loaded.to(device).eval()
        for row in rows:
            if row.batch == hf_batch:
                row.hf_tok_s = _hf_decode_tok_s(hf, hf_prompts[row.context], steps, device)
    report = {
        "bench": "engine-gpu", "model": str(args.model), "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."), "attention_backend": backend, "cuda_graphs": graphs,
        "ceilings": asdict(ceilings), "prefill": prefill,
        "decode": [asdict(r) | {"vs_hf": r.vs_hf} for r in rows],
    }
    _print(report)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return report


def _print(r: dict) -> None:
    c = r["ceilings"]
    print(f"\npdmesh bench engine — {r['model']} on {r['device_name']}, {r['dtype']}, "
          f"{r['attention_backend']}, CUDA graphs {'on' if r['cuda_graphs'] else 'off'}")
    print(f"ceilings: copy {c['copy_gb_s']:.0f} GB/s (read + write), matmul {c['matmul_tflop_s']:.0f} TFLOP/s")
    p = r["prefill"]
    print(f"prefill {p['tokens']} tokens: {p['tok_s']:.0f} tok/s, {p['tflop_s']:.0f} TFLOP/s = "
          f"{100 * p['of_matmul']:.0f}% of the matmul ceiling")
    print("decode: whole engine steps (of copy), and the model's forward alone (GPU time, fwd of copy)")
    print(f"{'batch':>5} {'context':>7} {'step ms':>8} {'tok/s':>9} {'GB/step':>8} {'GB/s':>7} "
          f"{'of copy':>7} {'fwd ms':>7} {'fwd of':>6} {'tokens':>7} {'HF tok/s':>9} {'vs HF':>6}")
    for d in r["decode"]:
        hf = f"{d['hf_tok_s']:9.0f} {d['vs_hf']:5.2f}x" if d["hf_tok_s"] else f"{'—':>9} {'':>6}"
        fwd = f"{d['forward_ms']:7.2f} {100 * d['forward_of_copy']:5.0f}%" if d["forward_ms"] else f"{'—':>7} {'':>6}"
        print(f"{d['batch']:>5} {d['context']:>7} {d['step_ms']:8.2f} {d['tok_s']:9.0f} "
              f"{d['bytes_per_step_gb']:8.2f} {d['bandwidth_gb_s']:7.0f} {100 * d['of_copy']:6.0f}% {fwd} "
              f"{d['tokens']:7d} {hf}")
