import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pdmesh", *args], capture_output=True, text=True, timeout=300
    )


def test_make_tiny_then_generate_streams_text(tmp_path: Path) -> None:
    model = tmp_path / "m"
    made = run("model", "make-tiny", str(model), "--arch", "qwen2", "--seed", "1")
    assert made.returncode == 0, made.stderr
    gen = run("generate", "--model", str(model), "--dtype", "float32", "--max-tokens", "8",
              "--num-blocks", "64", "def main():")
    assert gen.returncode == 0, gen.stderr
    assert "finish=length" in gen.stderr and "completion_tokens=8" in gen.stderr and gen.stdout.strip()


def test_invalid_request_exits_with_a_message(llama_dir: Path) -> None:
    gen = run("generate", "--model", str(llama_dir), "--num-blocks", "64", "--top-p", "3", "hi")
    assert gen.returncode == 2
    assert "top_p: must be in (0, 1]" in gen.stderr
