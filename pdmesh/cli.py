"""The ``pdmesh`` command line: ``model make-tiny``, ``generate``, ``bench engine``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pdmesh.errors import PdmeshError


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="Hugging Face model folder")
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
    if args.router:
        return _cmd_generate_remote(args)
    if not args.model:
        print("pdmesh: error: generate needs --model DIR or --router HOST:PORT", file=sys.stderr)
        return 2
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
    n_out = 0  # outputs are deltas: count as they stream

    def deltas():  # type: ignore[no-untyped-def]
        nonlocal last, n_out
        while engine.has_unfinished_requests():
            for out in engine.step():
                last = out
                for c in out.outputs:
                    n_out += len(c.token_ids)
                    yield c.text

    _print_stream(deltas())
    if last is not None:
        m = last.metrics
        _summary(last.outputs[0].finish_reason if last.outputs else None, len(last.prompt_token_ids),
                 n_out, m.num_cached_tokens, m.ttft or 0.0, time.monotonic() - start)
    return 0


def _print_stream(pieces) -> None:  # type: ignore[no-untyped-def]
    """Write text pieces to stdout as they arrive, then end the line."""
    for text in pieces:
        sys.stdout.write(text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()


def _summary(finish: str | None, prompt: int, completion: int, cached: int, ttft: float,
             total: float) -> None:
    print(f"[finish={finish} prompt_tokens={prompt} completion_tokens={completion} "
          f"cached_tokens={cached} ttft={1000 * ttft:.0f}ms total={total:.2f}s]", file=sys.stderr)


def _cmd_generate_remote(args: argparse.Namespace) -> int:
    from pdmesh.client import Client

    if args.chat:
        print("pdmesh: error: --chat applies to --model runs; send chat-formatted text to a router",
              file=sys.stderr)
        return 2
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                "max_tokens": args.max_tokens, "stop": args.stop or []}
    if args.seed is not None:
        sampling["seed"] = args.seed
    start = time.monotonic()
    first = None
    final = None

    def texts():  # type: ignore[no-untyped-def]
        nonlocal first, final
        with Client(args.router) as client:
            for resp in client.generate(args.prompt, **sampling):
                first = first or time.monotonic()
                final = resp
                yield resp.text

    _print_stream(texts())
    if final is not None:
        from pdmesh.rpc.convert import FINISH_NAMES

        u = final.usage
        _summary(FINISH_NAMES[final.finish_reason], u.prompt_tokens, u.completion_tokens,
                 u.cached_tokens, (first or start) - start, time.monotonic() - start)
    return 0


def _add_config_flags(p: argparse.ArgumentParser, cls: type) -> None:
    """Every field of a service config dataclass becomes a --flag (YAML and env also work)."""
    import dataclasses

    p.add_argument("--config", help="YAML file with the same option names")
    for f in dataclasses.fields(cls):
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                       metavar=f.name.upper())


def _service_config(args: argparse.Namespace, cls: type, env_prefix: str):  # type: ignore[no-untyped-def]
    import dataclasses

    from pdmesh.service_config import load_config

    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
    return load_config(cls, args.config, env_prefix, overrides)


def _run_service(coro_factory, cfg, name: str) -> int:  # type: ignore[no-untyped-def]
    import asyncio

    from pdmesh.telemetry.logging_setup import setup_logging
    from pdmesh.telemetry.tracing import setup_tracing, shutdown_tracing

    setup_logging()
    setup_tracing(f"pdmesh-{name}")
    try:
        asyncio.run(coro_factory(cfg))
    finally:
        shutdown_tracing()
    return 0


def _cmd_worker(role: str):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        from pdmesh.serving.worker_config import WorkerConfig
        from pdmesh.serving.worker_server import serve_worker

        args.role = role
        cfg = _service_config(args, WorkerConfig, "PDMESH_WORKER_")
        return _run_service(serve_worker, cfg, role)

    return run


def _cmd_router(args: argparse.Namespace) -> int:
    from services.router.config import RouterConfig
    from services.router.server import serve_router

    return _run_service(serve_router, _service_config(args, RouterConfig, "PDMESH_ROUTER_"), "router")


def _cmd_kvstore(args: argparse.Namespace) -> int:
    from services.kvstore.config import KVStoreConfig
    from services.kvstore.servicer import serve_kvstore

    return _run_service(serve_kvstore, _service_config(args, KVStoreConfig, "PDMESH_KVSTORE_"), "kvstore")


def _cmd_up(args: argparse.Namespace) -> int:
    import signal
    import threading

    from pdmesh.launcher import Mesh, MeshSpec

    worker_args = ["--dtype", args.dtype, "--block-size", str(args.block_size)]
    if args.num_blocks:
        worker_args += ["--num-blocks", str(args.num_blocks)]
    spec = MeshSpec(model=args.model, prefill=args.prefill, decode=args.decode, kvstore=args.kvstore,
                    port=args.port,
                    redis_url=args.redis_url or "", worker_args=worker_args,
                    router_args=["--block-size", str(args.block_size)], log_dir=args.log_dir or "")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    mesh = Mesh(spec)
    print(f"pdmesh up: starting {args.prefill} prefill + {args.decode} decode workers "
          f"(logs in {mesh.log_dir})", flush=True)
    mesh.start()
    try:
        print(f"{'redis':<10} {mesh.redis_url}")
        for p in [*mesh.kvstore, *mesh.prefill, *mesh.decode, mesh.router]:
            print(f"{p.name:<10} {p.address:<22} metrics http://{p.metrics_address}/metrics")
        print(f"pdmesh mesh ready: router on {mesh.router_address}", flush=True)
        if args.ready_file:
            Path(args.ready_file).write_text(mesh.router_address)
        stop.wait()
        print("pdmesh up: draining and stopping", flush=True)
    finally:
        mesh.stop()
    return 0


def _cmd_bench_tracing(args: argparse.Namespace) -> int:
    from pdmesh.bench.tracing import run_tracing_bench

    run_tracing_bench(args)
    return 0


def _cmd_bench_mesh(args: argparse.Namespace) -> int:
    from pdmesh.bench.mesh import run_mesh_bench

    run_mesh_bench(args)
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
    gen.add_argument("--router", default=None, help="send to a running mesh (HOST:PORT) instead")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.set_defaults(func=_cmd_generate)

    from pdmesh.serving.worker_config import WorkerConfig
    from services.router.config import RouterConfig

    for role in ("prefill", "decode"):
        w = sub.add_parser(role, help=f"run a {role} worker")
        _add_config_flags(w, WorkerConfig)
        w.set_defaults(func=_cmd_worker(role))
    from services.kvstore.config import KVStoreConfig

    kv = sub.add_parser("kvstore", help="run the shared CPU-memory KV-block tier")
    _add_config_flags(kv, KVStoreConfig)
    kv.set_defaults(func=_cmd_kvstore)
    r = sub.add_parser("router", help="run the router")
    _add_config_flags(r, RouterConfig)
    r.set_defaults(func=_cmd_router)

    up = sub.add_parser("up", help="start a whole mesh on this machine")
    up.add_argument("--model", required=True)
    up.add_argument("--prefill", type=int, default=1)
    up.add_argument("--decode", type=int, default=1)
    up.add_argument("--kvstore", type=int, default=1, choices=[0, 1], help="start the kvstore tier")
    up.add_argument("--port", type=int, default=50051, help="router port")
    up.add_argument("--redis-url", default=None, help="use this Redis instead of a private one")
    up.add_argument("--dtype", default="float32")
    up.add_argument("--block-size", type=int, default=16)
    up.add_argument("--num-blocks", type=int, default=0)
    up.add_argument("--log-dir", default=None)
    up.add_argument("--ready-file", default=None, help="write the router address here when ready")
    up.set_defaults(func=_cmd_up)

    bench = sub.add_parser("bench", help="benchmarks (print a table, write JSON)")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    beng = bsub.add_parser("engine", help="the in-process engine vs transformers")
    _add_engine_args(beng)
    beng.add_argument("--out", default="bench-results/engine.json")
    beng.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    beng.set_defaults(func=_cmd_bench_engine)
    bmesh = bsub.add_parser("mesh", help="the mesh vs in-process, routing policies, transfer, index")
    bmesh.add_argument("--model", required=True)
    bmesh.add_argument("--dtype", default="float32")
    bmesh.add_argument("--out", default="bench-results/mesh.json")
    bmesh.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    bmesh.set_defaults(func=_cmd_bench_mesh)
    btr = bsub.add_parser("tracing", help="per-request cost of tracing, off and on")
    btr.add_argument("--requests", type=int, default=5000)
    btr.add_argument("--out", default="bench-results/tracing.json")
    btr.set_defaults(func=_cmd_bench_tracing)
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
