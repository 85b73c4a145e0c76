"""``pdmesh prefill | decode | router | kvstore`` (one service) and ``pdmesh up`` (a mesh)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from pdmesh.cli.options import config_from_args

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


def _serve_function(role: str) -> Callable[[Any], Coroutine[Any, Any, None]]:
    if role == "prefill":
        from services.prefill.server import serve
    elif role == "decode":
        from services.decode.server import serve
    elif role == "router":
        from services.router.server import serve
    else:
        from services.kvstore.server import serve
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
        cfg = config_from_args(args, config_class(role), ENV_PREFIX[role])
        setup_logging()
        setup_tracing(f"pdmesh-{role}")
        exit_with_parent()
        try:
            run_service_loop(_serve_function(role)(cfg))
        finally:
            shutdown_tracing()
        return 0

    return run


def add_up_flags(up: argparse.ArgumentParser) -> None:
    up.add_argument("--model", required=True, help="Hugging Face model folder (required)")
    up.add_argument("--prefill", type=int, default=1, help="prefill workers (default: 1)")
    up.add_argument("--decode", type=int, default=1, help="decode workers (default: 1)")
    up.add_argument("--kvstore", type=int, default=1, choices=[0, 1],
                    help="start the shared kvstore tier (default: 1)")
    up.add_argument("--port", type=int, default=50051, help="router port; 0 = any free (default: 50051)")
    up.add_argument("--http-port", type=int, default=8000,
                    help="the router's OpenAI-compatible HTTP API; 0 = any free port (default: 8000)")
    up.add_argument("--no-http", action="store_true", help="serve gRPC only")
    up.add_argument("--no-restart", action="store_true",
                    help="leave a process that dies dead (default: restart it, with back-off)")
    up.add_argument("--api-key", default=None,
                    help="bearer token the HTTP API requires (default: PDMESH_API_KEY, else none)")
    up.add_argument("--redis-url", default=None, help="use this Redis instead of a private one (default: unset)")
    up.add_argument("--log-dir", default=None, help="where each process logs (default: a temp folder)")
    up.add_argument("--ready-file", default=None, help="write the router address to this file when ready (default: unset)")
    # Passed to every worker (and, where it is part of the mesh contract, router and kvstore);
    # unset flags leave each service its own default, shown here from the one source.
    from pdmesh.config import EngineArgs
    from pdmesh.service_config import field_docs

    docs = field_docs(EngineArgs)
    for name in ("dtype", "block_size", "hash_seed", "num_blocks", "kv_cache_memory_gb",
                 "max_num_seqs", "max_num_batched_tokens"):
        up.add_argument("--" + name.replace("_", "-"), default=None,
                        help=f"{docs[name]} (default: the worker's, {getattr(EngineArgs, name)})")
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


_ENGINE_FLAGS = ("dtype", "block_size", "hash_seed", "num_blocks", "kv_cache_memory_gb", "max_num_seqs",
                 "max_num_batched_tokens")


def _check_up(args: argparse.Namespace) -> None:
    """What ``pdmesh up`` can refuse before it starts a process: a worker count below zero,
    a folder that is not a model, an engine option out of range. Each is a one-line error
    naming the option, where a worker would otherwise exit at start-up (a zero block size
    divided by zero in the kvstore) and the launcher report it with a traceback."""
    from pdmesh.config import EngineArgs
    from pdmesh.errors import InvalidRequestError
    from pdmesh.model.config import ModelConfig
    from pdmesh.service_config import load_config

    for name in ("prefill", "decode"):
        if getattr(args, name) < 0:
            raise InvalidRequestError(name, f"must be 0 or more workers, got {getattr(args, name)}")
    ModelConfig.from_dir(args.model)
    load_config(EngineArgs, overrides={"model": args.model} | {n: getattr(args, n) for n in _ENGINE_FLAGS})


def run_up(args: argparse.Namespace) -> int:
    import os
    import signal
    import threading

    from pdmesh.launcher import Mesh, MeshSpec
    from pdmesh.supervisor import Supervisor

    _check_up(args)
    if args.decode == 0:
        print("pdmesh up: no decode worker: requests are refused (UNAVAILABLE, HTTP 503) until one "
              "joins through this mesh's Redis (pdmesh decode --redis-url ...)", flush=True)
    contract = _flags(args, ("dtype", "block_size", "hash_seed"))

    spec = MeshSpec(
        model=args.model, prefill=args.prefill, decode=args.decode, kvstore=args.kvstore,
        port=args.port, redis_url=args.redis_url or "", log_dir=args.log_dir or "",
        worker_args=contract + _flags(args, ("num_blocks", "kv_cache_memory_gb", "max_num_seqs",
                                             "max_num_batched_tokens", "threads")),
        router_args=contract + _flags(args, ("prefill_policy", "decode_policy", "disaggregation",
                                             "local_prefill_tokens", "prefill_busy_requests",
                                             "prefill_busy_tokens", "api_key")),
        http_port=None if args.no_http else args.http_port,
        decode_args=_flags(args, ("speculative_config",)),
        tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca,
        share_cores=not args.no_core_share,
    )
    colocated = spec.colocated_router_args()
    spec.router_args += colocated
    if colocated:
        print(f"pdmesh up: the workers share this machine's {os.cpu_count()} cores; router defaults for that: "
              f"{' '.join(colocated)} (set any of them to override)", flush=True)
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
