"""How each ``pdmesh`` command is typed: the end of its ``--help``."""

from __future__ import annotations

import argparse

M = ".cache/models/small-llama"
REDIS = "redis://127.0.0.1:6379/0"
EXAMPLES: dict[str, tuple[str, ...]] = {
    "model make-tiny": (f"pdmesh model make-tiny {M} --size small",
                        "pdmesh model make-tiny /tmp/tiny-qwen3 --arch qwen3"),
    "generate": (f"pdmesh generate --model {M} 'def fib(n):'",
                 "pdmesh generate --router localhost --chat --max-tokens 32 'Say hello'"),
    "prefill": (f"pdmesh prefill --model Qwen/Qwen3-0.6B --port 50061 --redis-url {REDIS}",),
    "decode": (f"pdmesh decode --model Qwen/Qwen3-0.6B --port 50062 --redis-url {REDIS}",),
    "router": (f"pdmesh router --model Qwen/Qwen3-0.6B --port 50051 --http-port 8000 --redis-url {REDIS}",),
    "kvstore": (f"pdmesh kvstore --model Qwen/Qwen3-0.6B --port 50071 --redis-url {REDIS}",),
    "up": ("pdmesh up --model Qwen/Qwen3-0.6B",
           "pdmesh up --model Qwen/Qwen3-8B --device cuda --gpus 0,1,2,3 --prefill 2 --decode 2 "
           "--gpu-memory-utilization 0.9"),
    "status": ("pdmesh status localhost:50051",),
    "probe": ("pdmesh probe 127.0.0.1:50051",),
    "bench engine": (f"pdmesh bench engine --model {M} --dtype float32",),
    "bench mesh": (f"pdmesh bench mesh --model {M} --sections engine,kv",),
    "bench profile": (f"pdmesh bench profile --model {M} --batch 32",),
    "bench serve": (f"pdmesh bench serve --model {M} --target pdmesh:1+1 --num-requests 32",
                    f"pdmesh bench serve --model {M} --target pdmesh:0+1 --compare vllm:~/.cache/pdmesh-peer"),
    "bench route-sim": ("pdmesh bench route-sim --workers 16",),
    "bench route-mesh": (f"pdmesh bench route-mesh --model {M}",),
    "bench spec": (f"pdmesh bench spec --model {M} --batches 1,4",),
    "bench tracing": ("pdmesh bench tracing --requests 2000",),
    "bench stalls": (f"pdmesh bench stalls --model {M} --cases decode,prefill",),
    "bench structured": (f"pdmesh bench structured --model {M}",),
}


def leaf_commands(parser: argparse.ArgumentParser, path: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command that runs something (no sub-commands of its own), by its path."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {path: parser}
    out: dict[str, argparse.ArgumentParser] = {}
    for name, sub in subs[0].choices.items():
        out |= leaf_commands(sub, f"{path} {name}".strip())
    return out


def add_examples(parser: argparse.ArgumentParser) -> None:
    """End every leaf command's help with its examples (refusing a command that has none)."""
    for path, command in leaf_commands(parser).items():
        lines = EXAMPLES.get(path)
        if not lines:
            raise KeyError(f"pdmesh {path} has no example in pdmesh/cli/examples.py")
        command.formatter_class = argparse.RawDescriptionHelpFormatter
        command.epilog = "examples:\n" + "\n".join(f"  {line}" for line in lines)
