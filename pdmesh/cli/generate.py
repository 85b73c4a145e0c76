"""``pdmesh generate``: one streamed generation, in process (``--model``) or through a mesh
(``--router``)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable

from pdmesh.cli.options import config_from_args, resolve_model_field
from pdmesh.config import EngineArgs


def print_stream(pieces: Iterable[str]) -> None:
    """Write text pieces to stdout as they arrive, then end the line."""
    for text in pieces:
        sys.stdout.write(text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()


def summary(finish: str | None, prompt: int, completion: int, cached: int, ttft: float,
            total: float, drafted: int = 0, accepted: int = 0) -> None:
    spec = f" spec_accepted={accepted}/{drafted}" if drafted else ""
    print(f"[finish={finish} prompt_tokens={prompt} completion_tokens={completion} "
          f"cached_tokens={cached}{spec} ttft={1000 * ttft:.0f}ms total={total:.2f}s]", file=sys.stderr)


def run_generate(args: argparse.Namespace) -> int:
    if args.router:
        return _remote(args)
    if not args.model:
        print("pdmesh: error: generate needs --model DIR or --router HOST:PORT", file=sys.stderr)
        return 2
    from pdmesh.engine.llm_engine import LLMEngine
    from pdmesh.sampling_params import SamplingParams

    engine = LLMEngine(resolve_model_field(config_from_args(args, EngineArgs, None)).engine_config())
    prompt = args.prompt
    if args.chat:
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        max_tokens=args.max_tokens, seed=args.seed, stop=tuple(args.stop or ()),
        output_kind="delta",
    )
    ids = engine.tokenizer.encode(prompt, add_special_tokens=False) if args.chat else prompt
    engine.add_request("cli-0", ids, params)
    start = time.monotonic()
    last = None
    n_out = 0  # outputs are deltas: count as they stream

    def deltas():
        nonlocal last, n_out
        while engine.has_unfinished_requests():
            for out in engine.step():
                last = out
                for c in out.outputs:
                    n_out += len(c.token_ids)
                    yield c.text

    print_stream(deltas())
    if last is not None:
        m = last.metrics
        summary(last.outputs[0].finish_reason if last.outputs else None, len(last.prompt_token_ids),
                n_out, m.num_cached_tokens, m.ttft or 0.0, time.monotonic() - start,
                m.spec_draft_tokens, m.spec_accepted_tokens)
    return 0


def _remote(args: argparse.Namespace) -> int:
    """Through a router: every failure the mesh reports (no router, a refused request, a
    deadline) is one line with its status and message, exit 1."""
    import grpc

    from pdmesh.cli.status import security_from_args
    from pdmesh.client import Client, router_address
    from pdmesh.rpc.convert import FINISH_NAMES

    address = router_address(args.router)
    prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                "max_tokens": args.max_tokens, "stop": args.stop or []}
    if args.seed is not None:
        sampling["seed"] = args.seed
    start = time.monotonic()
    first = None
    final = None

    def texts():
        nonlocal first, final
        with Client(address, timeout=args.timeout, security=security_from_args(args)) as client:
            for resp in client.generate(prompt, **sampling):
                first = first or time.monotonic()
                final = resp
                yield resp.text

    try:
        print_stream(texts())
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details()
        hint = (" (no router answers there: start a mesh with pdmesh up, or give --router HOST:PORT)"
                if code is grpc.StatusCode.UNAVAILABLE and "connect" in (details or "") else "")
        print(f"pdmesh generate: {address}: {code.name}: {details}{hint}", file=sys.stderr)
        return 1
    if final is not None:
        u = final.usage
        summary(FINISH_NAMES[final.finish_reason], u.prompt_tokens, u.completion_tokens,
                u.cached_tokens, (first or start) - start, time.monotonic() - start,
                u.spec_draft_tokens, u.spec_accepted_tokens)
    return 0
