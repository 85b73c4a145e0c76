"""What mesh to start on this machine: counts, flags per role, and the defaults that
follow from workers sharing one machine's cores (``pdmesh up``, ``Mesh``, the benches)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdmesh.placement import Placement

COLOCATED_PREFILL_BUSY_REQUESTS = 4
"""``--prefill-busy-requests`` for workers that split one machine's cores."""
COLOCATED_PREFILL_BUSY_TOKENS = 1024
"""``--prefill-busy-tokens`` for them: about four 256-token prompts of queued work, so
a burst of prompts sharing a few prefixes splits its groups between the workers (each
group then follows its first prompt) rather than sending four groups to one."""


@dataclass
class MeshSpec:
    model: str
    prefill: int = 2
    decode: int = 1
    kvstore: int = 0
    """0 or 1: start the shared CPU-memory KV tier and point the prefill workers at it."""
    port: int = 0
    """Router port (0 = any free port)."""
    http_port: int | None = None
    """The router's OpenAI-compatible HTTP port (0 = any free port); None = no HTTP."""
    redis_url: str = ""
    """Empty: start a private redis-server."""
    worker_args: list[str] = field(default_factory=list)
    """Extra flags for every worker (e.g. ["--num-blocks", "512"])."""
    prefill_args: list[str] = field(default_factory=list)
    decode_args: list[str] = field(default_factory=list)
    router_args: list[str] = field(default_factory=list)
    log_dir: str = ""
    """Where each process writes its log (default: a temporary folder)."""
    start_timeout_s: float = 180.0
    share_cores: bool = True
    """When the launcher splits the cores between workers (no ``--threads`` given), let
    an idle worker lend its share to busy ones (``pdmesh/engine/core_share.py``)."""
    tls_cert: str = ""
    """TLS for every process of the mesh (``--tls-cert/--tls-key/--tls-ca`` on each)."""
    tls_key: str = ""
    tls_ca: str = ""
    placement: Placement = field(default_factory=Placement)
    """Each worker's ``CUDA_VISIBLE_DEVICES`` (``pdmesh/placement.py``); empty: inherited."""

    def splits_cpu_cores(self) -> bool:
        """Whether the launcher divides this machine's cores between the workers (no
        ``--threads`` given, more than one worker, on CPU) and lets idle ones lend theirs."""
        args = [*self.worker_args, *self.prefill_args, *self.decode_args]
        device = args[args.index("--device") + 1] if "--device" in args else "cpu"
        return (self.share_cores and self.prefill + self.decode > 1 and "--threads" not in args
                and device.startswith("cpu"))

    def colocated_router_args(self) -> list[str]:
        """Router defaults for workers that split one machine's cores; each only where the
        caller did not set that flag itself.

        Conditional disaggregation (``--prefill-busy-requests 4 --prefill-busy-tokens
        1024``), so that a burst of prompts is prefilled by the decode worker too instead of
        queueing on the prefill worker's share of the cores. With it and lent cores, 1
        prefill + 1 decode on 2 cores made 1.10-1.39x the output of one worker on a burst of
        32 x 256 + 64 in `pdmesh bench mesh`, without it 0.70-0.80x (docs/performance/log.md
        §11); through `pdmesh bench serve`, 0.90x on that shape and 0.91-0.92x on prompts
        sharing four prefixes (§14).

        With several decode workers, ``--decode-policy pack``: one worker's batch is filled
        before the next gets a request, as one worker would batch them, while the others
        lend their cores (§32: 1 prefill + 2 decode on 2 cores from 0.70-0.82x of one
        worker's output with requests spread)."""
        if not self.splits_cpu_cores():
            return []
        args: list[str] = []
        if self.prefill and not {"--prefill-busy-requests", "--prefill-busy-tokens"} & set(self.router_args):
            args += ["--prefill-busy-requests", str(COLOCATED_PREFILL_BUSY_REQUESTS),
                     "--prefill-busy-tokens", str(COLOCATED_PREFILL_BUSY_TOKENS)]
        if self.decode > 1 and "--decode-policy" not in self.router_args:
            args += ["--decode-policy", "pack"]
        return args

