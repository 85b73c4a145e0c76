"""Whether a sequence ends with the token it just got, and why (one place for every rule:
stop token ids, EOS unless ignored, stop strings, ``max_tokens``, the model's context)."""

from __future__ import annotations

from collections.abc import Set

from pdmesh.request import SeqStatus, Sequence


def finish_status(seq: Sequence, token: int, stop_str: str | None, eos_token_ids: Set[int],
                  max_model_len: int) -> SeqStatus | None:
    """The finished status ``seq`` takes after ``token`` (setting ``stop_reason``), or None."""
    p = seq.params
    if seq.num_output_tokens >= p.min_tokens and (
        token in p.stop_token_ids or (not p.ignore_eos and token in eos_token_ids)
    ):
        seq.stop_reason = token if token in p.stop_token_ids else None
        return SeqStatus.FINISHED_STOPPED
    if stop_str is not None:
        seq.stop_reason = stop_str
        return SeqStatus.FINISHED_STOPPED
    if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= max_model_len:
        return SeqStatus.FINISHED_LENGTH
    return None
