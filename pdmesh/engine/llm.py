"""``LLM``: offline batch generation in one call."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from pdmesh.config import EngineArgs
from pdmesh.engine.llm_engine import LLMEngine
from pdmesh.request import RequestOutput
from pdmesh.sampling_params import SamplingParams


class LLM:
    """``LLM(model=DIR, dtype="float32").generate(prompts, params)``.

    Keyword arguments are the fields of ``EngineArgs`` (the same options, names and
    defaults as the CLI flags: ``block_size=16, num_blocks=512, threads=2`` ...).
    """

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.engine = LLMEngine(EngineArgs(model=model, **kwargs).engine_config())
        self._ids = itertools.count()

    def generate(
        self,
        prompts: str | list[int] | Sequence[str | list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order."""
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        params = params or SamplingParams()
        per_prompt = (
            [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        )
        order: dict[str, int] = {}
        for i, (prompt, p) in enumerate(zip(prompts, per_prompt, strict=True)):
            rid = f"llm-{next(self._ids)}"
            self.engine.add_request(rid, prompt, p.replace(output_kind="final_only"))
            order[rid] = i
        results: list[RequestOutput | None] = [None] * len(order)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    results[order[out.request_id]] = out
        return [r for r in results if r is not None]
