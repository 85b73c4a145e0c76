"""Token-mask cost of llguidance (pdmesh's grammar engine) against xgrammar on one
tokenizer and one nested JSON schema: compile time, microseconds per mask, and whether 20
sampled outputs parse (a sample may run to 300 tokens: the schema leaves one object open).
docs/structured-outputs.md keeps the figures.

xgrammar is not a dependency; put it beside the venv for this run only:
    .venv/bin/pip download --no-deps -d /tmp/pkgs xgrammar
    .venv/bin/pip install --target /tmp/xgr --no-deps /tmp/pkgs/xgrammar-*.whl apache-tvm-ffi
    .venv/bin/python scripts/compare_grammar_engines.py .cache/models/small-llama llg
    .venv/bin/python scripts/compare_grammar_engines.py .cache/models/small-llama xgr /tmp/xgr
"""
import json
import random
import sys
import time

import torch
from transformers import AutoTokenizer

tok = AutoTokenizer.from_pretrained(sys.argv[1])
V = len(tok)
schema = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bb", "ccc"]}, "minItems": 1, "maxItems": 4},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"]}},
    "required": ["name", "age", "tags", "address"], "additionalProperties": False}
words = (V + 31) // 32
def unpack(bm):
    bits = (bm[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.reshape(bm.shape[0], -1)[:, :V].bool()

def run(name, compile_fn, new, fill, accept, done, rounds=20):
    t0 = time.perf_counter(); g = compile_fn(); tc = time.perf_counter() - t0
    mask_t = n = 0
    rng = random.Random(0)
    outs = []
    for r in range(rounds):
        m = new(g); ids = []
        bm = torch.full((1, words), -1, dtype=torch.int32)
        for _ in range(300):
            a = time.perf_counter(); fill(m, bm); mask_t += time.perf_counter() - a; n += 1
            allowed = unpack(bm)[0].nonzero().flatten().tolist()
            t = rng.choice(allowed[:50]) if rng.random() < .7 else rng.choice(allowed)
            if t == tok.eos_token_id and not done(m):
                pass
            accept(m, t)
            if t == tok.eos_token_id or done(m): break
            ids.append(t)
        outs.append(tok.decode(ids))
    ok = sum(1 for o in outs if _valid(o))
    print(f"{name}: compile {tc*1e3:.1f} ms, mask {mask_t/n*1e6:.1f} us/token over {n} tokens, valid {ok}/{rounds}; e.g. {outs[0][:120]!r}")

def _valid(s):
    try: json.loads(s); return True
    except Exception: return False

which = sys.argv[2]
if which == "llg":
    import llguidance
    import llguidance.hf
    t0=time.perf_counter(); lt = llguidance.hf.from_tokenizer(tok, n_vocab=V); print("tokenizer", (time.perf_counter()-t0)*1e3, "ms")
    run("llguidance", lambda: llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False}),
        lambda g: llguidance.LLMatcher(lt, g),
        lambda m, bm: m.unsafe_compute_mask_ptr(bm.data_ptr(), bm.numel() * 4),
        lambda m, t: m.consume_token(t), lambda m: m.is_stopped())
else:
    sys.path.insert(0, sys.argv[3] if len(sys.argv) > 3 else "/tmp/xgr")
    import xgrammar as xgr
    t0=time.perf_counter(); info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=V); comp = xgr.GrammarCompiler(info); print("tokenizer", (time.perf_counter()-t0)*1e3, "ms")
    run("xgrammar", lambda: comp.compile_json_schema(json.dumps(schema), any_whitespace=False),
        lambda g: xgr.GrammarMatcher(g),
        lambda m, bm: m.fill_next_token_bitmask(bm),
        lambda m, t: m.accept_token(t), lambda m: m.is_terminated())
