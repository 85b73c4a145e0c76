"""A request resumed on a fresh engine from its first k tokens continues exactly as the
uninterrupted run: same tokens, same text, greedy and seeded, penalties included."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.engine.resume import Resume
from pdmesh.errors import InvalidRequestError
from pdmesh.sampling_params import SamplingParams

PROMPT = [0, 40, 41, 42, 43, 44, 45, 46, 47, 48]


def _run(engine: LLMEngine, rid: str, params: SamplingParams, resume: Resume | None = None
         ) -> tuple[list[int], str, list[str]]:
    """Tokens, text, and the text a streaming caller had after each token (a token that
    ends inside a UTF-8 character adds none until the character completes)."""
    engine.add_request(rid, PROMPT, params, resume=resume)
    tokens: list[int] = []
    text = ""
    seen: list[str] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens += out.outputs[0].token_ids
            text += out.outputs[0].text
            seen += [text] * len(out.outputs[0].token_ids)
    return tokens, text, seen


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, output_kind="delta"),
    SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=20, ignore_eos=True, output_kind="delta"),
    SamplingParams(temperature=0.7, seed=5, presence_penalty=1.0, frequency_penalty=0.5, max_tokens=20,
                   min_tokens=12, logprobs=2, output_kind="delta"),
], ids=["greedy", "seeded", "penalties"])
def test_resume_continues_the_same_tokens_and_text(llama_dir: Path, params: SamplingParams) -> None:
    engine = LLMEngine.from_model(str(llama_dir), dtype="float32", num_blocks=128)
    tokens, text, seen = _run(engine, "whole", params)
    assert len(tokens) == 20
    for k in (1, 7, 19):
        seen_text = seen[k - 1]
        more, more_text, _ = _run(engine, f"resume-{k}", params, Resume(tuple(tokens[:k]), len(seen_text)))
        assert more == tokens[k:], k
        assert seen_text + more_text == text, k


def test_resume_is_validated(llama_dir: Path) -> None:
    engine = LLMEngine.from_model(str(llama_dir), dtype="float32", num_blocks=64)
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        engine.add_request("r1", PROMPT, SamplingParams(max_tokens=2), resume=Resume((5, 6), 0))
    with pytest.raises(InvalidRequestError, match="outside"):
        engine.add_request("r2", PROMPT, SamplingParams(max_tokens=9), resume=Resume((10**7,), 0))
    assert engine.stats().used == 0 and not engine.has_unfinished_requests()
    _run(engine, "r1", SamplingParams(max_tokens=3))  # the refused ids are free again
