"""Request workloads: what each request sends and when it may start.

- random: token-id prompts of a fixed length, fixed output length;
- prefix: ``groups`` shared prefixes x suffixes (system prompts, few-shot templates);
- chat: multi-turn sessions whose conversation grows; turn t + 1 of a session waits for
  turn t and carries its answer;
- jsonl: one ``{"prompt": str | [ids], "max_tokens": int}`` per line.
Prompts are token ids drawn from a seeded generator (ids 10 .. vocab-10, away from the
specials), so every target sees exactly the same requests.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Request:
    prompt: list[int] | str
    max_tokens: int
    session: int = -1
    """Multi-turn: the conversation it belongs to (-1: independent)."""
    turn: int = 0
    follow_up: list[int] = field(default_factory=list)
    """Multi-turn: the user tokens of the next turn, appended after this turn's answer."""

    def __post_init__(self) -> None:
        if self.session >= 0 and isinstance(self.prompt, str):
            raise ValueError("a multi-turn session's prompts are token ids: its history is extended by the answer's")


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str = "random"
    num_requests: int = 32
    input_len: int = 256
    output_len: int = 64
    prefix_len: int = 512
    groups: int = 4
    turns: int = 4
    file: str = ""
    seed: int = 0
    vocab: int = 8192


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, vocab - 10) for _ in range(n)]


def build(spec: WorkloadSpec) -> list[Request]:
    rng = random.Random(spec.seed)
    if spec.kind == "random":
        return [Request(_ids(rng, spec.input_len, spec.vocab), spec.output_len) for _ in range(spec.num_requests)]
    if spec.kind == "prefix":
        prefixes = [_ids(rng, spec.prefix_len, spec.vocab) for _ in range(spec.groups)]
        return [Request(prefixes[i % spec.groups] + _ids(rng, spec.input_len, spec.vocab), spec.output_len)
                for i in range(spec.num_requests)]
    if spec.kind == "chat":
        sessions = max(1, spec.num_requests // spec.turns)
        out = []
        for s in range(sessions):
            first = _ids(rng, spec.input_len, spec.vocab)
            for t in range(spec.turns):
                out.append(Request(first if t == 0 else [], spec.output_len, s, t,
                                   _ids(rng, max(1, spec.input_len // 4), spec.vocab)))
        return out
    if spec.kind == "jsonl":
        lines = [json.loads(line) for line in Path(spec.file).read_text().splitlines() if line.strip()]
        return [Request(d["prompt"], int(d.get("max_tokens", spec.output_len))) for d in lines]
    raise ValueError(f"unknown workload {spec.kind!r}; choose random, prefix, chat or jsonl")
