"""Structured outputs in the engine: constrained greedy tokens equal transformers' under
the same grammar, every output matches its constraint, and the grammar's state follows the
tokens wherever they came from (a resume, a fork, speculative drafts)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pdmesh import LLM, SamplingParams
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.engine.resume import Resume
from pdmesh.errors import InvalidRequestError
from pdmesh.structured.spec import StructuredOutput
from tests.oracle import HFReference, mixed_prompts

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "level": {"type": "string", "enum": ["low", "mid", "high"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 999},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3},
        "owner": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                                   "ok": {"type": "boolean"}},
                  "required": ["id", "ok"], "additionalProperties": False},
    },
    "required": ["name", "level", "score", "tags", "owner"],
    "additionalProperties": False,
}
JSON = StructuredOutput.of_schema(SCHEMA)
REGEX = r"[A-Z][a-z]{2,5}-[0-9]{2}"
CHOICES = ("red", "green", "blue sky")
MAX_NEW = 160


def _valid(spec: StructuredOutput, text: str) -> None:
    if spec.json_schema is not None:
        jsonschema.validate(json.loads(text), json.loads(spec.json_schema))
    elif spec.regex is not None:
        assert re.fullmatch(spec.regex, text), text
    elif spec.choice is not None:
        assert text in spec.choice, text


def _hf_constrained(ref: HFReference, engine: LLMEngine, prompt: list[int], spec: StructuredOutput) -> list[int]:
    """transformers' greedy tokens with the grammar's mask as a logits processor: the
    oracle for what the engine's sampler must pick."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    matcher = engine.grammars.compile(spec).deep_copy()
    eos = list(engine.grammars.eos_token_ids)

    class Mask(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if input_ids.shape[1] > len(prompt):
                assert matcher.consume_token(int(input_ids[0, -1]))
            bits = torch.empty((scores.shape[1] + 31) // 32, dtype=torch.int32)
            matcher.unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * 4)
            allowed = ((bits[:, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[: scores.shape[1]]
            return scores.masked_fill(allowed[None, :] == 0, float("-inf"))

    ids = torch.tensor([prompt])
    out = ref.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW,
                             logits_processor=LogitsProcessorList([Mask()]), eos_token_id=eos, pad_token_id=eos[0])
    tokens = out[0, len(prompt):].tolist()
    return tokens


@pytest.fixture(scope="module")
def llm(llama_dir: Path) -> LLM:
    return LLM(str(llama_dir), dtype="float32", num_blocks=512)


@pytest.mark.parametrize("spec", [JSON, StructuredOutput(regex=REGEX), StructuredOutput(choice=CHOICES)],
                         ids=["json_schema", "regex", "choice"])
def test_constrained_greedy_equals_transformers_under_the_same_grammar(
        llm: LLM, hf_refs: dict[str, HFReference], spec: StructuredOutput) -> None:
    prompts = mixed_prompts(4, seed=3)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW, structured_output=spec))
    for prompt, out in zip(prompts, outs):
        c = out.outputs[0]
        assert c.finish_reason == "stop"
        expected = _hf_constrained(hf_refs["llama"], llm.engine, prompt, spec)
        assert c.token_ids == expected
        _valid(spec, c.text)


def test_sampled_outputs_of_every_kind_match_their_constraint(llm: LLM) -> None:
    specs = [JSON, StructuredOutput(regex=REGEX), StructuredOutput(choice=CHOICES),
             StructuredOutput(grammar='start: "(" num (("+" | "*") num)* ")"\nnum: /[1-9][0-9]?/'),
             StructuredOutput(grammar='root ::= "x" [a-c]{1,4} "!"')]
    params = [SamplingParams(temperature=1.0, top_p=0.95, seed=s, max_tokens=MAX_NEW, structured_output=spec)
              for spec in specs for s in range(6)]
    outs = llm.generate(mixed_prompts(len(params), seed=4), params)
    for p, out in zip(params, outs):
        c = out.outputs[0]
        assert c.finish_reason == "stop", c.text
        spec = p.structured_output
        assert spec is not None
        if spec.grammar is not None:
            pattern = r"\((?:[1-9][0-9]?)(?:[+*][1-9][0-9]?)*\)" if "start" in spec.grammar else r"x[a-c]{1,4}!"
            assert re.fullmatch(pattern, c.text), c.text
        else:
            _valid(spec, c.text)


def test_n_completions_each_follow_the_grammar(llm: LLM) -> None:
    out = llm.generate([[0, 20, 21, 22]], SamplingParams(n=4, temperature=1.0, seed=2, max_tokens=MAX_NEW,
                                                         structured_output=JSON))[0]
    assert len(out.outputs) == 4 and len({c.text for c in out.outputs}) > 1
    for c in out.outputs:
        _valid(JSON, c.text)


def test_resumed_constrained_request_continues_with_the_same_tokens(llama_dir: Path) -> None:
    """A failover resumes from the tokens so far: the grammar state is rebuilt from them."""
    params = SamplingParams(temperature=0.8, seed=9, max_tokens=MAX_NEW, structured_output=JSON,
                            output_kind="delta")
    whole = LLMEngine.from_model(str(llama_dir), dtype="float32", num_blocks=128)
    full = _drain(whole, "a", params)
    assert len(full) > 12
    fresh = LLMEngine.from_model(str(llama_dir), dtype="float32", num_blocks=128)
    rest = _drain(fresh, "b", params, Resume(tuple(full[:12]), 0))
    assert full[:12] + rest == full


def _drain(engine: LLMEngine, rid: str, params: SamplingParams, resume: Resume | None = None) -> list[int]:
    engine.add_request(rid, [0, 30, 31, 32, 33], params, resume=resume)
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens += out.outputs[0].token_ids
    assert engine.stats().used == 0
    return tokens


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_drafts_are_checked_against_the_grammar(llama_dir: Path, method: str) -> None:
    """Greedy constrained output is the same with drafts as without (drafts the grammar
    forbids are rejected), and no block stays in use."""
    prompts = [[11, 12, 13, 14, 15] * 6, *mixed_prompts(3, seed=6)]
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, structured_output=JSON)
    plain = [o.outputs[0].token_ids for o in LLM(str(llama_dir), dtype="float32", num_blocks=256)
             .generate(prompts, params)]
    cfg: dict[str, Any] = {"method": method, "num_speculative_tokens": 3, "disable_by_batch_size": 64}
    if method == "draft_model":
        cfg["model"] = str(llama_dir)
    spec_llm = LLM(str(llama_dir), dtype="float32", num_blocks=256, speculative_config=cfg)
    outs = spec_llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert sum(o.metrics.spec_accepted_tokens for o in outs) > 0
    assert spec_llm.engine.stats().used == 0


def test_a_constraint_that_does_not_compile_names_its_field(llm: LLM) -> None:
    cases = [(StructuredOutput(regex="[0-9"), "structured_output.regex"),
             (StructuredOutput(grammar="start: missing"), "structured_output.grammar"),
             (StructuredOutput(grammar="root ::= [a-"), "structured_output.grammar"),
             (StructuredOutput(json_schema='{"type": "strin"}'), "structured_output.json_schema"),
             (StructuredOutput(json_schema='{"type": "string", "format": "no-such-format"}'),
              "structured_output.json_schema")]
    for spec, field in cases:
        with pytest.raises(InvalidRequestError) as err:
            llm.engine.add_request("bad", [0, 5], SamplingParams(structured_output=spec))
        assert err.value.field == field
    for bad in [dict(), dict(regex="a", choice=("a",)), dict(json_schema="{not json"), dict(choice=())]:
        with pytest.raises(InvalidRequestError):
            StructuredOutput(**bad)  # type: ignore[arg-type]
    assert llm.engine.stats().used == 0


@pytest.mark.parametrize("thinking", ["required", "optional"])
def test_a_constraint_after_thinking_holds_the_answer_not_the_thinking(llama_dir: Path, thinking: str) -> None:
    """The thinking is free text through ``</think>`` (here resumed tokens, as a model would
    have written them: random weights do not); the answer after it matches the schema."""
    engine = LLMEngine.from_model(str(llama_dir), dtype="float32", num_blocks=128)
    opening = "" if thinking == "required" else "<think>"
    thought = engine.tokenizer.encode(opening + "Plan: {not json} <b>, then</think>", add_special_tokens=False)
    spec = StructuredOutput(json_schema=JSON.json_schema, thinking=thinking)  # type: ignore[arg-type]
    params = SamplingParams(temperature=0.9, seed=1, max_tokens=MAX_NEW + len(thought), structured_output=spec,
                            output_kind="final_only")
    engine.add_request("t", [0, 7, 8, 9], params, resume=Resume(tuple(thought), 0))
    outs = [o for _ in range(10_000) if engine.has_unfinished_requests() for o in engine.step()]
    c = outs[-1].outputs[0]
    answer = engine.tokenizer.decode(c.token_ids[len(thought):])
    assert c.finish_reason == "stop"
    _valid(JSON, answer)
    assert engine.stats().used == 0
    if thinking == "optional":  # or the answer at once, with no thinking at all
        direct = LLMEngine.from_model(str(llama_dir), dtype="float32", num_blocks=128)
        direct.add_request("d", [0, 7, 8, 9], SamplingParams(temperature=0, max_tokens=MAX_NEW, structured_output=spec,
                                                             output_kind="final_only"))
        outs = [o for _ in range(10_000) if direct.has_unfinished_requests() for o in direct.step()]
        text = outs[-1].outputs[0].text
        assert text.lstrip().startswith("<think>") or json.loads(text) is not None
