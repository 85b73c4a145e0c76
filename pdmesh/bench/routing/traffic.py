"""Traffic where routing decides the cost: skewed shared prefixes and growing conversations.

- Shared prefixes: ``groups`` system prompts / few-shot templates of ``prefix_len`` tokens,
  chosen with Zipf(``zipf``) popularity, each followed by a fresh ``suffix_len``-token user
  message.
- Conversations (``chat_share`` of the requests): a session starts from a group's prefix
  and a first message; each later turn carries the whole conversation so far, the previous
  answer (``output_len`` tokens) and a new ``turn_len``-token message, and starts only after
  the previous turn ended.
Every prompt is fixed in advance (answers are seeded tokens, not the model's), so the
simulator and a real mesh see exactly the same prompts and the oracle can be computed.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pdmesh.kv.block_hash import BlockHasher


@dataclass(frozen=True)
class TrafficSpec:
    num_requests: int = 2000
    groups: int = 64
    prefix_len: int = 1024
    zipf: float = 1.1
    suffix_len: int = 128
    chat_share: float = 0.3
    turns: int = 4
    turn_len: int = 96
    output_len: int = 64
    seed: int = 0
    vocab: int = 8192


@dataclass
class Job:
    index: int
    tokens: list[int]
    output_len: int
    session: int = -1
    """The conversation it belongs to (-1: independent)."""
    turn: int = 0
    next_turn: Job | None = field(default=None, repr=False)
    """The conversation's next turn, released when this one ends."""


@dataclass
class Traffic:
    spec: TrafficSpec
    starts: list[Job]
    """Independent requests and first turns, in arrival order."""
    jobs: list[Job]
    """Every request, first turns and later ones."""

    @property
    def prompt_tokens(self) -> int:
        return sum(len(j.tokens) for j in self.jobs)

    def oracle_computed(self, block_size: int) -> int:
        """Prompt tokens computed if every full block were computed once, the first time it
        is seen, and found cached ever after: the best any assignment of requests to workers
        can do when the workers' pools together hold the traffic's blocks (the benchmark
        sizes them so). Partial trailing blocks are never cacheable."""
        hasher = BlockHasher(block_size)
        seen: set[bytes] = set()
        computed = 0
        for job in self.jobs:
            hashes = hasher.hash_tokens(job.tokens)
            new = [h for h in hashes if h not in seen]
            seen.update(new)
            computed += len(new) * block_size + len(job.tokens) - len(hashes) * block_size
        return computed

    def unique_blocks(self, block_size: int) -> int:
        hasher = BlockHasher(block_size)
        return len({h for job in self.jobs for h in hasher.hash_tokens(job.tokens)})


def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (k + 1) ** s for k in range(n)]


def build_traffic(spec: TrafficSpec) -> Traffic:
    rng = random.Random(spec.seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, spec.vocab - 10) for _ in range(n)]

    prefixes = [ids(spec.prefix_len) for _ in range(spec.groups)]
    weights = _zipf_weights(spec.groups, spec.zipf)
    chat = int(spec.num_requests * spec.chat_share) // spec.turns * spec.turns
    singles = spec.num_requests - chat
    starts: list[Job] = []
    jobs: list[Job] = []
    kinds = ["single"] * singles + ["session"] * (chat // spec.turns)
    rng.shuffle(kinds)
    for session, kind in enumerate(kinds):
        prefix = prefixes[rng.choices(range(spec.groups), weights)[0]]
        if kind == "single":
            job = Job(len(jobs), prefix + ids(spec.suffix_len), spec.output_len)
            jobs.append(job)
            starts.append(job)
            continue
        tokens = prefix + ids(spec.suffix_len)
        previous: Job | None = None
        for turn in range(spec.turns):
            if turn:
                tokens = tokens + ids(spec.output_len) + ids(spec.turn_len)
            job = Job(len(jobs), list(tokens), spec.output_len, session, turn)
            jobs.append(job)
            if previous is None:
                starts.append(job)
            else:
                previous.next_turn = job
            previous = job
    return Traffic(spec, starts, jobs)


def add_traffic_arguments(p: argparse.ArgumentParser, defaults: TrafficSpec, skip: tuple[str, ...] = ()) -> None:
    """One ``--field`` option per ``TrafficSpec`` field (but ``vocab`` and ``skip``), with
    the benchmark's own defaults: route-sim and route-mesh describe traffic alike."""
    for f in fields(TrafficSpec):
        if f.name != "vocab" and f.name not in skip:
            default = getattr(defaults, f.name)
            p.add_argument(f"--{f.name.replace('_', '-')}", type=type(default), default=default,
                           help=f"traffic: {f.name} (default: %(default)s)")


def traffic_from_arguments(args: argparse.Namespace, defaults: TrafficSpec, **given: Any) -> TrafficSpec:
    """The spec ``add_traffic_arguments`` options describe; ``given`` for the skipped fields."""
    return replace(defaults, **{f.name: getattr(args, f.name) for f in fields(TrafficSpec)
                                if f.name != "vocab" and f.name not in given}, **given)
