"""``pdmesh prefill | decode | router | kvstore`` (one service) and ``pdmesh up`` (a mesh)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdmesh.cli.options import config_from_args, resolve_model_field

if TYPE_CHECKING:
    from pdmesh.model.source import ModelSource
    from pdmesh.placement import Placement

ENV_PREFIX = {"prefill": "PDMESH_WORKER_", "decode": "PDMESH_WORKER_", "router": "PDMESH_ROUTER_",
              "kvstore": "PDMESH_KVSTORE_"}


def config_class(role: str) -> type:
    """The config dataclass of a service role (imports stay torch-free)."""
    if role in ("prefill", "decode"):
        from services.worker.config import WorkerConfig

        return WorkerConfig
    if role == "router":
        from services.router.config import RouterConfig

        return RouterConfig
    from services.kvstore.config import KVStoreConfig

    return KVStoreConfig


_SERVERS = {
    "prefill": "services.prefill.server",
    "decode": "services.decode.server",
    "router": "services.router.server",
    "kvstore": "services.kvstore.server",
}


def _serve_function(role: str) -> Callable[[Any], Coroutine[Any, Any, None]]:
    """The role's ``serve`` coroutine, its service imported only for the role that runs."""
    serve: Callable[[Any], Coroutine[Any, Any, None]] = importlib.import_module(_SERVERS[role]).serve
    return serve


def run_service(role: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from pdmesh.rpc.process import exit_with_parent, run_service_loop
        from pdmesh.telemetry.logging_setup import setup_logging
        from pdmesh.telemetry.tracing import setup_tracing, shutdown_tracing

        if role in ("prefill", "decode"):
            from pdmesh.allocator import keep_freed_memory

            keep_freed_memory()  # before any thread gets an arena of its own
            args.role = role
        cfg = resolve_model_field(config_from_args(args, config_class(role), ENV_PREFIX[role]))
        setup_logging()
        setup_tracing(f"pdmesh-{role}")
        exit_with_parent()
        try:
            run_service_loop(_serve_function(role)(cfg))
        finally:
            shutdown_tracing()
        return 0

    return run


_ENGINE_FLAGS = ("dtype", "device", "block_size", "hash_seed", "num_blocks", "kv_cache_memory_gb",
                 "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "max_model_len")
"""Engine options ``pdmesh up`` passes to every worker (where given)."""
_CONTRACT = ("dtype", "block_size", "hash_seed")
"""Of those, what the router and the kvstore must share too."""


def add_up_flags(up: argparse.ArgumentParser) -> None:
    up.add_argument("--model", required=True,
                    help="Hugging Face model folder, or hub id ORG/NAME[@REVISION] resolved once through "
                         "the local Hugging Face cache and handed to every process (required)")
    up.add_argument("--served-model-name", default=None,
                    help="names clients use for the model, comma-separated (default: what --model says: "
                         "the hub id, or the folder's name)")
    up.add_argument("--prefill", type=int, default=1, help="prefill workers (default: 1)")
    up.add_argument("--decode", type=int, default=1, help="decode workers (default: 1)")
    up.add_argument("--kvstore", type=int, default=1, choices=[0, 1],
                    help="start the shared kvstore tier (default: 1)")
    up.add_argument("--port", type=int, default=50051,
                    help="the router's gRPC port, where clients dial; 0 = any free (default: 50051; a service "
                         "started alone binds its --port, 0 = any free, written to --port-file)")
    up.add_argument("--http-port", type=int, default=8000,
                    help="the router's OpenAI-compatible HTTP API; 0 = any free port (default: 8000; a router "
                         "started alone serves HTTP only with --http-port)")
    up.add_argument("--no-http", action="store_true", help="serve gRPC only")
    up.add_argument("--no-restart", action="store_true",
                    help="leave a process that dies dead (default: restart it, with back-off)")
    up.add_argument("--api-key", default=None,
                    help="bearer token the HTTP API requires (default: PDMESH_API_KEY, else none)")
    up.add_argument("--redis-url", default=None, help="use this Redis instead of a private one (default: unset)")
    up.add_argument("--log-dir", default=None, help="where each process logs (default: a temp folder)")
    up.add_argument("--access-log", action="store_true",
                    help="the router logs one line per finished request (default: off)")
    up.add_argument("--ready-file", default=None,
                    help="write the router address to this file when ready (default: unset)")
    # Passed to every worker (and, where it is part of the mesh contract, router and kvstore);
    # unset flags leave each service its own default, shown here from the one source.
    from pdmesh.config import EngineArgs
    from pdmesh.service_config import field_docs

    docs = field_docs(EngineArgs)
    for name in _ENGINE_FLAGS:
        up.add_argument("--" + name.replace("_", "-"), default=None,
                        help=f"{docs[name]} (default: the worker's, {getattr(EngineArgs, name)})")
    up.add_argument("--gpus", default=None,
                    help="with --device cuda: one GPU id per worker, prefill workers first (0,1,2,3); each "
                         "worker sees only its own (CUDA_VISIBLE_DEVICES), repeat an id to share one "
                         "(default: GPUs 0..N-1, one per worker)")
    up.add_argument("--prefill-gpus", default=None, help="the prefill workers' own GPU ids (default: from --gpus)")
    up.add_argument("--decode-gpus", default=None, help="the decode workers' own GPU ids (default: from --gpus)")
    up.add_argument("--threads", default=None,
                    help="torch threads per worker (default: the machine's cores shared equally)")
    up.add_argument("--no-core-share", action="store_true",
                    help="workers keep their equal share of the cores even while a peer is idle "
                         "(default: an idle worker lends its share to busy ones)")
    for flag, what in (("--tls-cert", "PEM certificate every process serves and presents"),
                       ("--tls-key", "PEM key of --tls-cert"),
                       ("--tls-ca", "PEM CA: mutual TLS between all processes and with clients")):
        up.add_argument(flag, default="", help=f"{what} (default: plaintext)")
    up.add_argument("--speculative-config", default=None,
                    help=f"decode workers only: {docs['speculative_config']} (default: off)")
    # Router options.
    up.add_argument("--tool-call-parser", default=None,
                    choices=("hermes", "llama3_json", "mistral", "pythonic", "qwen3_xml"),
                    help="how the router reads tool calls when a chat's tool_choice is auto, the format the "
                    "model was trained on (default: none; tool_choice auto is refused)")
    up.add_argument("--reasoning-parser", default=None, choices=("deepseek_r1", "qwen3"),
                    help="split a reasoning model's <think>...</think> into reasoning_content; structured "
                    "outputs then hold the answer after it (default: none)")
    up.add_argument("--prefill-policy", default=None, help="prefill routing policy (default: cache_aware)")
    up.add_argument("--decode-policy", default=None,
                    help="decode routing policy: holder | least_loaded | round_robin | pack (default: pack "
                         "when several decode workers split this machine's cores, else holder)")
    up.add_argument("--disaggregation", default=None,
                    help="strict | fallback_local: without a prefill worker, fail or prefill on decode "
                         "(default: fallback_local)")
    up.add_argument("--local-prefill-tokens", default=None,
                    help="prompts with fewer tokens than this beyond what their decode worker caches "
                         "prefill there (default: 0 = never)")
    up.add_argument("--prefill-busy-requests", default=None,
                    help="prefill on the decode worker when the prefill worker already has this many "
                         "of the router's prefills (default: 4 when the workers split this machine's "
                         "cores, else 0 = never)")
    up.add_argument("--prefill-busy-tokens", default=None,
                    help="the same when the prefill worker already has this many uncached prompt tokens "
                         "queued (default: 1024 when the workers split this machine's cores, else 0 = never)")


def _flags(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for name in names:
        value = getattr(args, name)
        if value is not None:
            out += ["--" + name.replace("_", "-"), str(value)]
    return out




def _check_up(args: argparse.Namespace) -> tuple[ModelSource, Placement]:
    """What ``pdmesh up`` can refuse before it starts a process: a worker count below zero,
    a taken router port (gRPC or HTTP), a model that is not there, an engine option out of
    range. Each is a one-line error naming the option, where a worker would otherwise exit
    at start-up (a zero block size divided by zero in the kvstore) and the launcher report it with a traceback."""
    from pdmesh.config import EngineArgs
    from pdmesh.errors import InvalidRequestError
    from pdmesh.model.config import ModelConfig
    from pdmesh.model.source import resolve_model
    from pdmesh.placement import place
    from pdmesh.rpc.process import check_port_free
    from pdmesh.service_config import load_config

    for name in ("prefill", "decode"):
        if getattr(args, name) < 0:
            raise InvalidRequestError(name, f"must be 0 or more workers, got {getattr(args, name)}")
    source = resolve_model(args.model)
    ModelConfig.from_dir(source.path)
    load_config(EngineArgs, overrides={"model": str(source.path)} | {n: getattr(args, n) for n in _ENGINE_FLAGS})
    check_port_free("127.0.0.1", args.port, "--port")
    if not args.no_http:
        if args.http_port and args.http_port == args.port:
            raise InvalidRequestError("http_port", f"must differ from --port ({args.port})")
        check_port_free("127.0.0.1", args.http_port, "--http-port")
    return source, place(args.prefill, args.decode, args.device or "cpu", args.gpus, args.prefill_gpus,
                         args.decode_gpus)


def run_up(args: argparse.Namespace) -> int:
    import os
    import signal
    import threading

    from pdmesh.launcher import Mesh, MeshSpec
    from pdmesh.supervisor import Supervisor

    source, placement = _check_up(args)
    served = args.served_model_name or source.name
    if placement.shared:
        print(f"pdmesh up: GPU {', '.join(placement.shared)} is shared by several workers (as --gpus says)",
              flush=True)
    if (placement.prefill or placement.decode) and not (args.device or "cpu").startswith("cuda"):
        print("pdmesh up: --gpus without --device cuda: each worker gets its CUDA_VISIBLE_DEVICES and "
              "computes on the CPU", flush=True)
    if args.decode == 0:
        print("pdmesh up: no decode worker: requests are refused (UNAVAILABLE, HTTP 503) until one "
              "joins through this mesh's Redis (pdmesh decode --redis-url ...)", flush=True)
    if (args.device or "").startswith("cuda") and args.dtype in (None, "auto"):
        # The kvstore resolves "auto" as a CPU would; on GPUs the workers pick bfloat16 for a
        # float32 config, so name the workers' dtype for every process of the mesh.
        from pdmesh.kv.layout import resolve_dtype_name
        from pdmesh.model.config import ModelConfig

        args.dtype = resolve_dtype_name("auto", ModelConfig.from_dir(source.path), args.device)
    contract = _flags(args, _CONTRACT)

    spec = MeshSpec(
        model=str(source.path), prefill=args.prefill, decode=args.decode, kvstore=args.kvstore,
        port=args.port, redis_url=args.redis_url or "", log_dir=args.log_dir or "",
        worker_args=contract + _flags(args, tuple(n for n in _ENGINE_FLAGS if n not in _CONTRACT) + ("threads",)),
        router_args=contract + _flags(args, ("prefill_policy", "decode_policy", "disaggregation",
                                             "local_prefill_tokens", "prefill_busy_requests",
                                             "prefill_busy_tokens", "api_key", "tool_call_parser", "reasoning_parser"))
        + ["--served-model-name", served] + (["--access-log", "true"] if args.access_log else []),
        http_port=None if args.no_http else args.http_port,
        decode_args=_flags(args, ("speculative_config",)),
        tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca,
        share_cores=not args.no_core_share, placement=placement,
    )
    colocated = spec.colocated_router_args()
    spec.router_args += colocated
    if colocated:
        print(f"pdmesh up: the workers share this machine's {os.cpu_count()} cores; router defaults for that: "
              f"{' '.join(colocated)} (set any of them to override)", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    mesh = Mesh(spec, progress=lambda line: print(f"pdmesh up: {line}", flush=True))
    print(f"pdmesh up: starting {args.prefill} prefill + {args.decode} decode workers "
          f"(logs in {mesh.log_dir})", flush=True)
    mesh.start()
    try:
        print(f"{'redis':<10} {mesh.redis_url}")
        for p in [p for p in mesh.processes() if p is not mesh.redis]:
            gpu = f"  GPU {p.gpu}" if p.gpu is not None else ""
            print(f"{p.name:<10} {p.address:<22} metrics http://{p.metrics_address}/metrics{gpu}")
        if spec.http_port is not None:
            print(f"{'http':<10} {mesh.http_url}  (OpenAI API: {mesh.http_url}/v1)")
        print(f"pdmesh mesh ready: router on {mesh.router_address}", flush=True)
        if args.ready_file:
            if spec.http_port is not None:
                Path(args.ready_file + ".http").write_text(mesh.http_url)
            Path(args.ready_file).write_text(mesh.router_address)
        supervisor = None if args.no_restart else Supervisor(mesh)
        while not stop.wait(1.0):
            for line in supervisor.check() if supervisor is not None else []:
                print(f"pdmesh up: {line}", flush=True)
        print("pdmesh up: draining and stopping", flush=True)
    finally:
        mesh.stop()
    return 0
