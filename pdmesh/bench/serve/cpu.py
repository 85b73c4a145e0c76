"""CPU seconds a benchmark run cost, per process and per kernel thread name.

Both servers run on the same cores as everything else on the machine, so a server whose
gRPC streams, HTTP front or router burn CPU takes it from its own engine. Throughput
alone does not say where a gap comes from; this does: the benchmark reads every
descendant process's threads (``/proc/PID/task/TID/stat``: user + system ticks) before
and after the measured run, and its own process's (the client). pdmesh names its engine
and poller threads (``pdmesh.telemetry.thread_name``); vLLM names its engine process.

Linux only (``/proc``); elsewhere the accounting is empty and the table says so.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

_TICK = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
_PROC = Path("/proc")


@dataclass
class Snapshot:
    threads: dict[tuple[int, int], tuple[str, str, float]] = field(default_factory=dict)
    """(pid, tid) -> (process label, thread name, CPU seconds so far)."""


def _stat(path: Path) -> tuple[str, float] | None:
    """(comm, user + system seconds) of one ``stat`` file; None if the thread is gone."""
    try:
        text = path.read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return comm, (int(fields[11]) + int(fields[12])) * _TICK  # utime, stime (fields 14, 15)


def _label(pid: int) -> str:
    """``pdmesh router``, ``pdmesh worker``, ``redis-server``, ``VLLM::EngineCore``…"""
    try:
        argv = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    words = [a.decode(errors="replace") for a in argv if a]
    if "-m" in words[:3]:  # python -m pdmesh worker …
        i = words.index("-m")
        return " ".join(words[i + 1:i + 3])
    if not words:
        return str(pid)
    first = Path(words[0]).name
    if first.startswith("python") and len(words) > 1:
        return f"{Path(words[1]).name} {words[2] if len(words) > 2 else ''}".strip()
    return first


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(text[text.rindex(")") + 2:].split()[1])
            children[ppid].append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def snapshot(root: int | None = None) -> Snapshot:
    """Every thread of ``root`` (default: this process) and of its descendants."""
    snap = Snapshot()
    if not _PROC.is_dir():
        return snap
    me = os.getpid()
    for pid in _descendants(root or me):
        label = "client" if pid == me else _label(pid)
        try:
            tids = [int(t.name) for t in (_PROC / str(pid) / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            got = _stat(_PROC / str(pid) / "task" / str(tid) / "stat")
            if got is not None:
                snap.threads[(pid, tid)] = (label, got[0], got[1])
    return snap


def spent(before: Snapshot, after: Snapshot) -> dict[str, dict[str, float]]:
    """Process label -> thread name -> CPU seconds between the two snapshots (threads
    that started in between count from zero; threads that ended in between are lost,
    which a server under a benchmark does not do to its busy threads)."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, (label, name, seconds) in after.threads.items():
        prior = before.threads.get(key)
        out[label][name] += seconds - (prior[2] if prior else 0.0)
    return {label: {n: round(s, 3) for n, s in sorted(names.items(), key=lambda kv: -kv[1]) if s > 0}
            for label, names in out.items()}


def totals(by_process: dict[str, dict[str, float]]) -> tuple[float, float]:
    """(server seconds, client seconds)."""
    client = sum(by_process.get("client", {}).values())
    server = sum(sum(names.values()) for label, names in by_process.items() if label != "client")
    return server, client


def lines(by_process: dict[str, dict[str, float]], top: int = 4) -> list[str]:
    """One line per process: its seconds and its busiest thread names."""
    out = []
    for label, names in sorted(by_process.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(names.values())
        if total < 0.01:
            continue
        busiest = ", ".join(f"{n} {s:.2f}" for n, s in list(names.items())[:top])
        out.append(f"  {label:<24} {total:7.2f} s  ({busiest})")
    return out
