"""Which GPU each worker of ``pdmesh up`` gets: one process per GPU, by ``CUDA_VISIBLE_DEVICES``.

A worker sees only the device it is given, as ``cuda:0``, so its KV pool, its NIXL
registration and its kernels all land there; without this every worker of a multi-GPU
node opened ``cuda:0``. ``--gpus 0,1,2,3`` gives the prefill workers the first ids and the
decode workers the next; ``--prefill-gpus`` / ``--decode-gpus`` give a role its own list.
An id may repeat (workers then share that GPU), which is said, never done silently.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

from pdmesh.errors import InvalidRequestError

_ID = re.compile(r"^(\d+|GPU-[0-9a-fA-F-]+|MIG-[\w/-]+)$")
"""An index, a GPU UUID or a MIG instance, as ``CUDA_VISIBLE_DEVICES`` accepts them."""


@dataclass(frozen=True)
class Placement:
    prefill: tuple[str, ...] = ()
    """``CUDA_VISIBLE_DEVICES`` of prefill worker i (empty: the launcher's own environment)."""
    decode: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()
    """Ids given to more than one worker."""

    def of(self, role: str, index: int) -> str | None:
        ids = self.prefill if role == "prefill" else self.decode
        return ids[index] if index < len(ids) else None


def parse_ids(flag: str, value: str | None) -> list[str] | None:
    if value is None:
        return None
    ids = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in ids if not _ID.match(v)]
    if bad or not ids:
        raise InvalidRequestError(flag.lstrip("-").replace("-", "_"),
                                  f"expected GPU ids such as 0,1,2 (or GPU-/MIG- UUIDs), got {value!r}")
    return ids


def place(prefill: int, decode: int, device: str, gpus: str | None = None, prefill_gpus: str | None = None,
          decode_gpus: str | None = None, count_gpus: int | None = None) -> Placement:
    """Each worker's GPU. A role's own list comes first; ``gpus`` is shared out, in order,
    to the roles without one (prefill first). On CUDA with no list at all, GPUs 0..N-1 one
    per worker, when the node has that many (``count_gpus``, else ``visible_gpu_count``).
    Every list must hold exactly one id per worker it serves."""
    lists = {"prefill": parse_ids("--prefill-gpus", prefill_gpus), "decode": parse_ids("--decode-gpus", decode_gpus)}
    counts = {"prefill": prefill, "decode": decode}
    pool = parse_ids("--gpus", gpus)
    if pool is None and lists["prefill"] is None and lists["decode"] is None:
        if not device.startswith("cuda"):
            return Placement()
        available = visible_gpu_count() if count_gpus is None else count_gpus
        if available < prefill + decode:
            raise InvalidRequestError("gpus", f"{prefill + decode} workers and {available} GPUs visible: give "
                                      "--gpus with one id per worker (repeat an id to share a GPU)")
        pool = [str(i) for i in range(prefill + decode)]
    for role, ids in lists.items():
        if ids is not None and len(ids) != counts[role]:
            raise InvalidRequestError(f"{role}_gpus", f"{counts[role]} {role} workers need {counts[role]} "
                                      f"GPU ids, got {len(ids)} ({','.join(ids)})")
    if pool is not None:
        takers = [role for role, ids in lists.items() if ids is None]
        need = sum(counts[r] for r in takers)
        if len(pool) != need:
            raise InvalidRequestError("gpus", f"{need} workers ({' + '.join(f'{counts[r]} {r}' for r in takers)}) "
                                      f"need {need} GPU ids (repeat an id to share a GPU), got {len(pool)}")
        for role in takers:
            lists[role], pool = pool[:counts[role]], pool[counts[role]:]
    pre, dec = tuple(lists["prefill"] or ()), tuple(lists["decode"] or ())
    used = [*pre, *dec]
    return Placement(pre, dec, tuple(sorted({i for i in used if used.count(i) > 1})))


def visible_gpu_count() -> int:
    """GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else ``nvidia-smi -L``
    (no torch import in the launcher)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return len([v for v in env.split(",") if v.strip()])
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
