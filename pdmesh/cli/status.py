"""``pdmesh status ROUTER``: the router's view of the mesh as a table; ``pdmesh probe
ADDRESS``: exit 0 when a service's gRPC health says SERVING (a Kubernetes exec probe that,
unlike kubelet's built-in gRPC probe, speaks TLS)."""

from __future__ import annotations

import argparse
import sys

import grpc


def add_status(sub) -> None:
    p = sub.add_parser("status", help="the workers a router knows, their state and load, and the index's health")
    p.add_argument("router", help="the router's gRPC address, HOST:PORT")
    add_security_flags(p)
    p.set_defaults(func=run_status)


def add_probe(sub) -> None:
    p = sub.add_parser("probe", help="exit 0 if the service at ADDRESS reports SERVING (health check)")
    p.add_argument("address", help="HOST:PORT of any pdmesh service")
    add_security_flags(p, api_key=False)
    p.set_defaults(func=run_probe)


def run_probe(args: argparse.Namespace) -> int:
    from pdmesh.client import Security
    from pdmesh.rpc.health import health_status

    status = health_status(args.address, Security(args.tls_ca, args.tls_cert, args.tls_key).credentials())
    print(f"{args.address}: {status}")
    return 0 if status == "SERVING" else 1


def add_security_flags(p: argparse.ArgumentParser, api_key: bool = True) -> None:
    p.add_argument("--tls-ca", default="", help="PEM CA to verify the server (default: plaintext)")
    p.add_argument("--tls-cert", default="", help="PEM client certificate, for mutual TLS (default: none)")
    p.add_argument("--tls-key", default="", help="PEM key of --tls-cert (default: none)")
    if api_key:
        p.add_argument("--api-key", default=None, help="bearer token (default: PDMESH_API_KEY, else none)")


def security_from_args(args: argparse.Namespace):
    import os

    from pdmesh.client import Security

    return Security(args.tls_ca, args.tls_cert, args.tls_key,
                    args.api_key if args.api_key is not None else os.environ.get("PDMESH_API_KEY", ""))


def run_status(args: argparse.Namespace) -> int:
    from pdmesh.client import Client, router_address

    with Client(router_address(args.router), security=security_from_args(args)) as client:
        try:
            resp = client.list_workers()
        except grpc.RpcError as exc:
            print(f"pdmesh status: {args.router}: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    print(f"router {args.router}   prefix index: {resp.index}")
    header = ("ROLE", "WORKER", "ADDRESS", "DEVICE", "STATE", "IN-FLIGHT", "RUNNING", "WAITING", "FREE/BLOCKS",
              "FROM", "REASON")
    rows = [header]
    for w in sorted(resp.workers, key=lambda w: (w.role, w.address)):
        i = w.info
        has = w.HasField("info")
        rows.append((w.role, i.worker_id if has else "?", w.address, (i.device or "?") if has else "-",
                     w.state, str(w.in_flight),
                     str(i.num_running) if has else "-", str(i.num_waiting) if has else "-",
                     f"{i.free_blocks}/{i.num_blocks}" if has else "-",
                     "redis" if w.joined else "seed", w.refused_reason))
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    for r in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(r, widths)).rstrip())
    return 0
