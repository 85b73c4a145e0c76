"""The ``pdmesh`` command line: ``model make-tiny``, ``generate``, ``bench engine``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from pdmesh.errors import PdmeshError


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="Hugging Face model folder")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=None, help="KV pool size (default: from memory)")
    p.add_argument("--kv-cache-memory-gb", type=float, default=2.0)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")


def engine_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from pdmesh.config import CacheConfig, EngineConfig, SchedulerConfig

    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        num_threads=args.threads,
        cache=CacheConfig(
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            kv_cache_memory_gb=args.kv_cache_memory_gb,
        ),
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs
        ),
    )


def _cmd_make_tiny(args: argparse.Namespace) -> int:
    from pdmesh.tools.make_tiny import make_tiny

    out = make_tiny(args.dir, args.arch, args.size, args.seed, args.shard_bytes)
    print(f"wrote {args.size} {args.arch} model (seed {args.seed}) to {out}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from pdmesh.engine.llm_engine import LLMEngine
    from pdmesh.sampling_params import SamplingParams

    engine = LLMEngine(engine_config(args))
    prompt = args.prompt
    if args.chat:
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        max_tokens=args.max_tokens, seed=args.seed, stop=tuple(args.stop or ()),
        output_kind="delta",
    )
    engine.add_request("cli-0", engine.tokenizer.encode(prompt) if args.chat else prompt, params)
    start = time.monotonic()
    last = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            for c in out.outputs:
                sys.stdout.write(c.text)
                sys.stdout.flush()
            last = out
    sys.stdout.write("\n")
    sys.stdout.flush()
    if last is not None:
        m = last.metrics
        done = last.outputs[0] if last.outputs else None
        print(
            f"[finish={done.finish_reason if done else '?'} prompt_tokens={len(last.prompt_token_ids)} "
            f"cached_tokens={m.num_cached_tokens} ttft={1000 * (m.ttft or 0):.0f}ms "
            f"total={time.monotonic() - start:.2f}s]",
            file=sys.stderr,
        )
    return 0


def _cmd_bench_engine(args: argparse.Namespace) -> int:
    from pdmesh.bench.engine import run_engine_bench

    run_engine_bench(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdmesh", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    model = sub.add_parser("model", help="model utilities")
    msub = model.add_subparsers(dest="model_command", required=True)
    tiny = msub.add_parser("make-tiny", help="write a seeded random HF model folder")
    tiny.add_argument("dir")
    tiny.add_argument("--arch", default="llama", choices=["llama", "qwen2", "qwen3"])
    tiny.add_argument("--size", default="tiny", choices=["tiny", "small"])
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--shard-bytes", type=int, default=None, help="write sharded safetensors")
    tiny.set_defaults(func=_cmd_make_tiny)

    gen = sub.add_parser("generate", help="stream one generation to the terminal")
    _add_engine_args(gen)
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.set_defaults(func=_cmd_generate)

    bench = sub.add_parser("bench", help="benchmarks (print a table, write JSON)")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    beng = bsub.add_parser("engine", help="the in-process engine vs transformers")
    _add_engine_args(beng)
    beng.add_argument("--out", default="bench-results/engine.json")
    beng.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    beng.set_defaults(func=_cmd_bench_engine)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except PdmeshError as exc:
        print(f"pdmesh: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
