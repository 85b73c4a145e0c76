"""Token-mask cost of llguidance (pdmesh's grammar engine) against xgrammar on one
tokenizer and one nested JSON schema: compile time, microseconds per mask, and whether 20
sampled outputs parse (a sample may run to 300 tokens: the schema leaves one object open).
docs/structured-outputs.md keeps the figures.

xgrammar is not a dependency; put it beside the venv for this run only:
    .venv/bin/pip download --no-deps -d /tmp/pkgs xgrammar
    .venv/bin/pip install --target /tmp/xgr --no-deps /tmp/pkgs/xgrammar-*.whl apache-tvm-ffi
    .venv/bin/python scripts/probes/structured/compare_grammar_engines.py .cache/models/small-llama llg
    .venv/bin/python scripts/probes/structured/compare_grammar_engines.py .cache/models/small-llama xgr /tmp/xgr
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "address"],
    "properties": {
        "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bb", "ccc"]}, "minItems": 1, "maxItems": 4},
        "address": {"type": "object", "required": ["city", "zip"], "properties": {
            "city": {"type": "string", "maxLength": 12}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
    },
}


def unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    bits = (bitmask[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


def parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def run(tok: Any, name: str, compile_fn: Callable[[], Any], new: Callable[[Any], Any],
        fill: Callable[[Any, torch.Tensor], None], accept: Callable[[Any, int], None],
        done: Callable[[Any], bool], rounds: int = 20) -> None:
    """Compile once, then sample ``rounds`` outputs under the grammar (70% from the first 50
    allowed tokens, else any allowed), timing only the mask computations."""
    vocab = len(tok)
    started = time.perf_counter()
    grammar = compile_fn()
    compile_s = time.perf_counter() - started
    mask_s, masks, outs = 0.0, 0, []
    rng = random.Random(0)
    for _ in range(rounds):
        matcher, ids = new(grammar), []
        bitmask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
        for _ in range(300):
            started = time.perf_counter()
            fill(matcher, bitmask)
            mask_s, masks = mask_s + time.perf_counter() - started, masks + 1
            allowed = unpack(bitmask, vocab)[0].nonzero().flatten().tolist()
            token = rng.choice(allowed[:50]) if rng.random() < 0.7 else rng.choice(allowed)
            accept(matcher, token)
            if token == tok.eos_token_id or done(matcher):
                break
            ids.append(token)
        outs.append(tok.decode(ids))
    valid = sum(parses(o) for o in outs)
    print(f"{name}: compile {compile_s * 1e3:.1f} ms, mask {mask_s / masks * 1e6:.1f} us/token over {masks} tokens, "
          f"valid {valid}/{rounds}; e.g. {outs[0][:120]!r}")


def llguidance_run(tok: Any) -> None:
    import llguidance
    import llguidance.hf

    started = time.perf_counter()
    lt = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok))
    print(f"tokenizer {(time.perf_counter() - started) * 1e3:.1f} ms")
    run(tok, "llguidance",
        lambda: llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": False}),
        lambda g: llguidance.LLMatcher(lt, g),
        lambda m, bm: m.unsafe_compute_mask_ptr(bm.data_ptr(), bm.numel() * 4),
        lambda m, t: m.consume_token(t), lambda m: m.is_stopped())


def xgrammar_run(tok: Any, where: str) -> None:
    sys.path.insert(0, where)
    import xgrammar as xgr

    started = time.perf_counter()
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok)))
    print(f"tokenizer {(time.perf_counter() - started) * 1e3:.1f} ms")
    run(tok, "xgrammar", lambda: compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False),
        lambda g: xgr.GrammarMatcher(g),
        lambda m, bm: m.fill_next_token_bitmask(bm),
        lambda m, t: m.accept_token(t), lambda m: m.is_terminated())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a model folder (its tokenizer is used)")
    parser.add_argument("engine", choices=("llg", "xgr"))
    parser.add_argument("xgrammar_dir", nargs="?", default="/tmp/xgr", help="where xgrammar was installed")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    if args.engine == "llg":
        llguidance_run(tok)
    else:
        xgrammar_run(tok, args.xgrammar_dir)


if __name__ == "__main__":
    main()
