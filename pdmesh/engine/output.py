"""Per-request bookkeeping between steps and the ``RequestOutput`` a user sees.

A ``RequestState`` groups the sequences of one request (``n`` completions), their
detokenizers and what has already been streamed, and renders cumulative, delta or
final-only outputs. Stop-string hold-back lives here: while a request is unfinished, a
delta never includes the last ``max_stop_len - 1`` characters, which might still turn out
to be the start of a stop string.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pdmesh.engine.detokenizer import IncrementalDetokenizer
from pdmesh.kv.block_hash import extra_keys_for
from pdmesh.request import CompletionOutput, RequestMetrics, RequestOutput, Sequence, TokenLogprob
from pdmesh.sampling_params import SamplingParams
from pdmesh.tokenizer import Tokenizer


@dataclass(slots=True)
class _Cursor:
    """How much of one completion has been emitted."""

    tokens: int = 0
    chars: int = 0
    done: bool = False


@dataclass(slots=True)
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    seqs: list[Sequence] = field(default_factory=list)
    detoks: list[IncrementalDetokenizer] = field(default_factory=list)
    cursors: list[_Cursor] = field(default_factory=list)
    hold_kv: bool = False
    prompt_logprobs_sent: bool = False
    """Keep the blocks when finished (a prefill worker's KV waiting to be written out)."""

    @property
    def finished(self) -> bool:
        seqs = self.seqs
        if len(seqs) != self.params.n:
            return False
        return seqs[0].status.finished if len(seqs) == 1 else all(s.status.finished for s in seqs)

    def new_sequence(self, tokenizer: Tokenizer, device: str, token_ids: list[int]) -> Sequence:
        """Add completion number ``len(seqs)`` with its detokenizer and, when seeded, its
        own generator (seed + index, so siblings differ and each is reproducible)."""
        p, index = self.params, len(self.seqs)
        seq_id = self.request_id if index == 0 else f"{self.request_id}#{index}"
        seq = Sequence(
            seq_id, self.request_id, index, p, len(self.prompt_token_ids), token_ids,
            self.metrics.arrival_time, extra_keys_for(p.cache_salt),
        )
        if p.seed is not None:
            seq.generator = torch.Generator(device=device).manual_seed((p.seed + index) % 2**63)
        self.seqs.append(seq)
        self.detoks.append(IncrementalDetokenizer.for_prompt(
            tokenizer, self.prompt_token_ids, p.stop, p.include_stop_str_in_output, p.skip_special_tokens,
        ))
        self.cursors.append(_Cursor())
        return seq

    def render(self) -> RequestOutput | None:
        """The output to emit now, or None when there is nothing new for this output kind."""
        kind = self.params.output_kind
        finished = self.finished
        if kind == "final_only" and not finished:
            return None
        holdback = 0 if finished else max(0, self.params.max_stop_len - 1)
        outputs: list[CompletionOutput] = []
        for seq, detok, cur in zip(self.seqs, self.detoks, self.cursors):
            reason = seq.finish_reason
            tokens = seq.output_token_ids
            text = detok.text
            visible = len(text) if reason else max(cur.chars, len(text) - holdback)
            if kind == "delta":
                if cur.done or (len(tokens) == cur.tokens and visible == cur.chars and not reason):
                    continue
                out = CompletionOutput(
                    seq.index,
                    text[cur.chars : visible],
                    tokens[cur.tokens :],
                    reason,
                    seq.stop_reason,
                    seq.logprobs[cur.tokens :] if self.params.logprobs is not None else None,
                )
            else:
                out = CompletionOutput(
                    seq.index,
                    text[:visible],
                    list(tokens),
                    reason,
                    seq.stop_reason,
                    list(seq.logprobs) if self.params.logprobs is not None else None,
                )
            cur.tokens, cur.chars, cur.done = len(tokens), visible, reason is not None
            outputs.append(out)
        if not outputs and not finished:
            return None
        return RequestOutput(
            self.request_id, self.prompt, self.prompt_token_ids, outputs, finished, self.metrics,
            self._prompt_logprobs(kind),
        )

    def _prompt_logprobs(self, kind: str) -> list[TokenLogprob] | None:
        """The prompt's logprobs, once all are known: on the first output that carries them
        (deltas), or on every output (cumulative, final)."""
        if self.params.prompt_logprobs is None or not self.seqs:
            return None
        lps = self.seqs[0].prompt_logprobs
        if len(lps) < len(self.prompt_token_ids) - 1 or (kind == "delta" and self.prompt_logprobs_sent):
            return None
        self.prompt_logprobs_sent = True
        return list(lps)
