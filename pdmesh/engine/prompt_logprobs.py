"""Prompt logprobs from a step's prompt rows (``SamplingParams.prompt_logprobs``).

The model runner puts a request's prompt positions among the LM head's rows of each chunk
(``StepResult.prompt_rows``); each row's log-softmax at the prompt token it predicts, with
the top-N, is kept on the sequence until its output carries them (``RequestState``).
"""

from __future__ import annotations

import torch

from pdmesh.engine.model_runner import StepResult
from pdmesh.engine.sampler import token_logprob


def record_prompt_logprobs(result: StepResult) -> None:
    assert result.prompt_logits is not None
    logprobs = torch.log_softmax(result.prompt_logits.float(), dim=-1)
    row = 0
    for seq, first, count in result.prompt_rows:
        top = seq.params.prompt_logprobs or 0
        for i in range(count):
            seq.prompt_logprobs.append(token_logprob(logprobs[row + i], seq.token_ids[first + i + 1], top))
        row += count
