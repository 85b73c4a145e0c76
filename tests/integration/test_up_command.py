"""``pdmesh up`` as a user types it, and the clients they point at it: a model by hub id
from a Hugging Face cache (offline), its served name, per-worker GPU placement (a fake
device list on CPU: what each worker is given and says it was given), the ready line and
the endpoint table, ``pdmesh generate`` and ``pdmesh status`` through it, chat greedy
tokens against ``transformers`` on the rendered template, and the SIGTERM drain."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hub_cache import add_to_hub_cache

REPO = "acme/tiny-llama"
API_KEY = "up-test-key"


def pdmesh(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pdmesh", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


class Up:
    """A running ``pdmesh up``: its process, what it printed, its addresses."""

    def __init__(self, popen: subprocess.Popen[str], out: Path, ready: Path) -> None:
        self.popen, self.out, self.ready = popen, out, ready

    @property
    def text(self) -> str:
        return self.out.read_text()

    @property
    def router(self) -> str:
        return self.ready.read_text().strip()

    @property
    def http(self) -> str:
        return Path(str(self.ready) + ".http").read_text().strip()


@pytest.fixture(scope="module")
def hub_env(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("hf-cache")
    add_to_hub_cache(cache, REPO, llama_dir)
    return {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def start_up(root: Path, env: dict[str, str], *flags: str) -> Up:
    """``pdmesh up --model REPO ... FLAGS`` in the background, returned once it is ready."""
    root.mkdir(parents=True, exist_ok=True)
    out, ready = root / "up.out", root / "ready"
    popen = subprocess.Popen(
        [sys.executable, "-m", "pdmesh", "up", "--model", REPO, "--port", "0", "--http-port", "0",
         "--dtype", "float32", "--num-blocks", "128", "--log-dir", str(root / "logs"), "--ready-file", str(ready),
         *flags], stdout=out.open("w"), stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + 300
    while not ready.is_file():
        if popen.poll() is not None or time.monotonic() > deadline:
            popen.kill()
            raise AssertionError(out.read_text())
        time.sleep(0.2)
    return Up(popen, out, ready)


def stop(up: Up) -> None:
    """SIGTERM, as a user stops it (it drains and stops every process, Redis included);
    killed only if it has not stopped within a minute."""
    if up.popen.poll() is None:
        up.popen.send_signal(signal.SIGTERM)
        try:
            up.popen.wait(60)
        except subprocess.TimeoutExpired:
            up.popen.kill()
            up.popen.wait(30)


@pytest.fixture(scope="module")
def up(hub_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    mesh = start_up(tmp_path_factory.mktemp("up"), hub_env, "--prefill", "1", "--decode", "1", "--device", "cpu",
                    "--gpus", "5,7", "--api-key", API_KEY, "--access-log")
    try:
        yield mesh
    finally:
        stop(mesh)


def test_up_serves_a_hub_id_under_its_own_name(up: Up) -> None:
    text = up.text
    assert "pdmesh mesh ready: router on " + up.router in text
    assert "pdmesh up: --gpus without --device cuda" in text
    request = urllib.request.Request(f"{up.http}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    models = json.loads(urllib.request.urlopen(request, timeout=30).read())
    assert [m["id"] for m in models["data"]] == [REPO]
    body = json.dumps({"prompt": "hello there", "max_tokens": 4, "temperature": 0}).encode()  # no "model"
    request = urllib.request.Request(f"{up.http}/v1/completions", data=body, headers={
        "Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
    assert answer["model"] == REPO and answer["usage"]["completion_tokens"] == 4


def test_each_worker_is_given_its_own_gpu_and_says_so(up: Up) -> None:
    table = {line.split()[0]: line for line in up.text.splitlines() if line.startswith(("prefill-0", "decode-0"))}
    assert table["prefill-0"].endswith("GPU 5") and table["decode-0"].endswith("GPU 7"), table
    status = pdmesh("status", up.router, "--api-key", API_KEY)
    assert status.returncode == 0, status.stderr
    rows = {line.split()[1]: line for line in status.stdout.splitlines()[2:]}
    assert "cpu (CUDA_VISIBLE_DEVICES=5)" in rows["prefill-0"] and "cpu (CUDA_VISIBLE_DEVICES=7)" in rows["decode-0"]


def test_generate_through_the_router_with_its_key_and_without(up: Up) -> None:
    ok = pdmesh("generate", "--router", up.router, "--api-key", API_KEY, "--max-tokens", "5", "def main():")
    assert ok.returncode == 0, ok.stderr
    assert "finish=length" in ok.stderr and "completion_tokens=5" in ok.stderr
    refused = pdmesh("generate", "--router", up.router, "--max-tokens", "5", "def main():")
    assert refused.returncode == 1
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"pdmesh generate: {up.router}: UNAUTHENTICATED: this router requires an API key")


def test_chat_greedy_tokens_equal_transformers_on_the_rendered_template(up: Up, llama_dir: Path) -> None:
    """Chat over gRPC (the router renders the template) and over HTTP, both against
    ``transformers`` generating from ``apply_chat_template``'s ids."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pdmesh.client import Client, Security

    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime."}]
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    model = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # EOS is a token like any other, as with ignore_eos
    prompt = torch.tensor([ids])
    want = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                          max_new_tokens=12)[0, len(ids):].tolist()
    with Client(up.router, security=Security(api_key=API_KEY)) as client:
        got = client.complete(messages, max_tokens=12, temperature=0, ignore_eos=True)
    assert got.prompt_tokens == len(ids)
    assert got.token_ids == want
    body = json.dumps({"messages": messages, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                       "return_token_ids": True}).encode()
    request = urllib.request.Request(f"{up.http}/v1/chat/completions", data=body, headers={
        "Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
    assert answer["choices"][0]["token_ids"] == want


def test_generate_chat_from_the_cli(up: Up) -> None:
    chat = pdmesh("generate", "--router", up.router, "--api-key", API_KEY, "--chat", "--max-tokens", "3", "hi")
    assert chat.returncode == 0 and "finish=" in chat.stderr, chat.stderr


def test_sigterm_drains_and_stops_every_process(hub_env: dict[str, str], tmp_path: Path) -> None:
    mesh = start_up(tmp_path, hub_env, "--prefill", "0", "--decode", "1", "--kvstore", "0", "--access-log")
    try:
        done = pdmesh("generate", "--router", mesh.router, "--max-tokens", "3", "hi")
        assert done.returncode == 0, done.stderr
        mesh.popen.send_signal(signal.SIGTERM)
        assert mesh.popen.wait(60) == 0
    finally:
        stop(mesh)
    assert "pdmesh up: draining and stopping" in mesh.text
    logs = tmp_path / "logs"
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    assert [line for line in ps if str(logs) in line] == []  # nothing it started outlives it
    access = (logs / "router.log").read_text()
    assert " length: prompt " in access and "completion 3" in access  # --access-log's line for the request


def test_a_taken_http_port_is_one_line_before_anything_starts(llama_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        done = pdmesh("up", "--model", str(llama_dir), "--port", "0", "--http-port", str(port))
        took = time.monotonic() - start
    assert done.returncode == 2
    assert done.stderr.strip() == (f"pdmesh: error: cannot listen on 127.0.0.1:{port}: the port is taken, or the "
                                   "address is not this machine's (pick another --http-port, or 0 for any free one)")
    assert "starting" not in done.stdout and took < 5, (done.stdout, took)  # no worker was started


def test_generate_with_no_router_there_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    done = pdmesh("generate", "--router", f"127.0.0.1:{port}", "--timeout", "10", "hello")
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"pdmesh generate: 127.0.0.1:{port}: UNAVAILABLE:") and "start a mesh" in line


def test_a_router_started_alone_on_a_taken_http_port_says_so_in_one_line(llama_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = pdmesh("router", "--model", str(llama_dir), "--port", "0", "--http-port", str(port))
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if " INFO " not in line]
    assert errors == [f"pdmesh: error: cannot listen on 127.0.0.1:{port}: the port is taken, or the address is "
                      "not this machine's (pick another --http-port, or 0 for any free one)"]
