"""``pdmesh bench spec``: output tok/s with and without speculative decoding, in process.

Workloads (greedy unless named otherwise), each at batch 1, 4 and 16:
- ``copy``: prompts cut from Python source, continued by the model (code completion, the
  traffic prompt lookup is made for);
- ``random``: random token prompts, greedy;
- ``random-sampled``: random token prompts at temperature 1 — drafts are nearly always
  rejected, so this row shows what speculation costs when it cannot pay.
Every configuration gets its own engine; rounds alternate between configurations and the
best round counts (timings on shared machines wander by ±20%). The table gives output
tok/s, the speed-up over no speculation, the acceptance rate and the mean accepted length
(tokens per verification step, the target's own included).
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pdmesh.engine.llm import LLM
from pdmesh.sampling_params import SamplingParams


@dataclass
class SpecRow:
    workload: str
    batch: int
    config: str
    tok_s: float
    speedup: float
    acceptance_rate: float | None
    mean_accepted_length: float | None


def _workloads(llm: LLM, n: int, length: int) -> dict[str, tuple[list[list[int]], SamplingParams]]:
    import argparse as source_a
    import dataclasses as source_b

    tokens = llm.engine.tokenizer.encode(inspect.getsource(source_a) + inspect.getsource(source_b))
    step = max(1, (len(tokens) - length) // n)
    copy = [tokens[i * step : i * step + length] for i in range(n)]
    rng = random.Random(0)
    vocab = llm.engine.model_config.vocab_size
    rand = [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(n)]
    return {
        "copy": (copy, SamplingParams(temperature=0, ignore_eos=True)),
        "random": (rand, SamplingParams(temperature=0, ignore_eos=True)),
        "random-sampled": (rand, SamplingParams(temperature=1.0, seed=0, ignore_eos=True)),
    }


def _run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int, int, int]:
    """Output tok/s, drafts, accepted drafts, verification steps."""
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    m = [o.metrics for o in outs]
    return (sum(len(o.outputs[0].token_ids) for o in outs) / seconds,
            sum(x.spec_draft_tokens for x in m), sum(x.spec_accepted_tokens for x in m),
            sum(x.spec_steps for x in m))


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in str(text).split(",") if x.strip())


def run_spec_bench(args: argparse.Namespace) -> list[SpecRow]:
    common: dict[str, Any] = {"dtype": args.dtype, "num_blocks": args.num_blocks}
    if args.threads:
        common["threads"] = args.threads
    configs: dict[str, dict[str, Any] | None] = {"none": None}
    for k in _ints(args.num_speculative_tokens):
        spec_common = {"num_speculative_tokens": k, "disable_by_batch_size": args.disable_by_batch_size}
        configs[f"ngram k={k}"] = {"method": "ngram", **spec_common}
        if args.draft_model:
            configs[f"draft k={k}"] = {"method": "draft_model", "model": args.draft_model, **spec_common}
    engines = {name: LLM(args.model, speculative_config=cfg, **common) for name, cfg in configs.items()}
    batches = (1, 4) if args.quick else _ints(args.batches)
    out_len = 16 if args.quick else args.output_len
    workloads = _workloads(engines["none"], max(batches), 64 if args.quick else args.input_len)
    for llm in engines.values():  # warm-up: first calls allocate and pick kernels
        llm.generate(workloads["random"][0][:2], SamplingParams(temperature=0, max_tokens=4))
    rows: list[SpecRow] = []
    _print_header(args)
    for wl, (prompts, params) in workloads.items():
        params = params.replace(max_tokens=out_len)
        for batch in batches:
            best: dict[str, tuple[float, int, int, int]] = {}
            for _ in range(args.rounds):
                for name, llm in engines.items():
                    res = _run(llm, prompts[:batch], params)
                    if name not in best or res[0] > best[name][0]:
                        best[name] = res
            base = best["none"][0]
            for name, (tok_s, drafted, accepted, steps) in best.items():
                rows.append(SpecRow(wl, batch, name, tok_s, tok_s / base,
                                    accepted / drafted if drafted else None,
                                    1 + accepted / steps if steps else None))
                _print_row(rows[-1])
    _report(rows, args)
    return rows


def _print_header(args: argparse.Namespace) -> None:
    print(f"\npdmesh bench spec — model {args.model}, dtype {args.dtype}, "
          f"{args.input_len} in / {args.output_len} out, best of {args.rounds} alternating rounds")
    print(f"{'workload':<15} {'batch':>5} {'speculation':<14} {'tok/s':>8} {'speed-up':>9} "
          f"{'accepted':>9} {'mean len':>9}", flush=True)


def _print_row(r: SpecRow) -> None:
    acc = f"{r.acceptance_rate:9.2f}" if r.acceptance_rate is not None else f"{'—':>9}"
    mal = f"{r.mean_accepted_length:9.2f}" if r.mean_accepted_length is not None else f"{'—':>9}"
    print(f"{r.workload:<15} {r.batch:>5} {r.config:<14} {r.tok_s:8.1f} {r.speedup:8.2f}x {acc} {mal}",
          flush=True)


def _report(rows: list[SpecRow], args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"bench": "spec", "model": str(args.model), "draft_model": args.draft_model,
               "machine": platform.machine(), "quick": bool(args.quick),
               "rows": [asdict(r) for r in rows]}
    out.write_text(json.dumps(payload, indent=2) + "\n")
    _plot(rows, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def _plot(rows: list[SpecRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.2), sharey=True)
    for ax, wl in zip(axes, workloads):
        for cfg in dict.fromkeys(r.config for r in rows):
            pts = [(r.batch, r.speedup) for r in rows if r.workload == wl and r.config == cfg]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=cfg)
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(wl)
        ax.set_xlabel("batch")
    axes[0].set_ylabel("speed-up over no speculation")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
