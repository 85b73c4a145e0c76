"""Token selection, vectorised over the batch.

Order of operations (each step runs only when some row asks for it):
  raw log-softmax for logprobs → repetition / presence / frequency penalties → min_tokens
  (stop tokens masked) → greedy rows take the argmax; sampling rows are divided by their
  temperature, filtered by top-k, top-p and min-p, and drawn with the exponential race
  ``argmax(p / q), q ~ Exp(1)``. A seeded row draws ``q`` from its own generator, so its
  tokens do not depend on what else shares the batch.

Logprobs are those of the raw model distribution (before penalties and temperature), the
quantity ``transformers`` reports as ``log_softmax(logits)``.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from pdmesh.request import Sequence, TokenLogprob


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


class Sampler:
    def __init__(self, eos_token_ids: Seq[int]) -> None:
        self.eos_token_ids = tuple(eos_token_ids)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        """``logits`` is float32 [len(seqs), vocab]; it is modified in place."""
        want_logprobs = [s.params.logprobs is not None for s in seqs]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None
        self._apply_penalties(logits, seqs)
        self._apply_min_tokens(logits, seqs)
        tokens = self._select(logits, seqs)
        token_list = tokens.tolist()
        out_lp: list[TokenLogprob | None] = [None] * len(seqs)
        if raw_logprobs is not None:
            for i, seq in enumerate(seqs):
                if want_logprobs[i]:
                    out_lp[i] = _token_logprob(raw_logprobs[i], token_list[i], seq.params.logprobs or 0)
        return SamplerOutput(token_list, out_lp)

    # -- logits processors ------------------------------------------------------------
    @staticmethod
    def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
        rows = [
            i for i, s in enumerate(seqs)
            if s.params.repetition_penalty != 1.0
            or s.params.presence_penalty
            or s.params.frequency_penalty
        ]
        if not rows:
            return
        vocab = logits.shape[-1]
        dev = logits.device
        idx = torch.tensor(rows, device=dev)
        sub = logits[idx]
        counts = torch.zeros_like(sub)
        seen = torch.zeros(sub.shape, dtype=torch.bool, device=dev)
        for r, i in enumerate(rows):
            seq = seqs[i]
            out = torch.tensor(seq.output_token_ids, dtype=torch.long, device=dev)
            out = out[out < vocab]
            counts[r].scatter_add_(0, out, torch.ones(len(out), device=dev))
            seen[r, torch.tensor(seq.token_ids, dtype=torch.long, device=dev).clamp_max(vocab - 1)] = True
        rep = torch.tensor([seqs[i].params.repetition_penalty for i in rows], device=dev)[:, None]
        penalised = torch.where(sub > 0, sub / rep, sub * rep)
        sub = torch.where(seen, penalised, sub)
        freq = torch.tensor([seqs[i].params.frequency_penalty for i in rows], device=dev)[:, None]
        pres = torch.tensor([seqs[i].params.presence_penalty for i in rows], device=dev)[:, None]
        sub = sub - freq * counts - pres * (counts > 0).float()
        logits[idx] = sub

    def _apply_min_tokens(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        for i, seq in enumerate(seqs):
            p = seq.params
            if seq.num_output_tokens < p.min_tokens:
                stops = list(p.stop_token_ids)
                if not p.ignore_eos:
                    stops.extend(self.eos_token_ids)
                if stops:
                    logits[i, stops] = float("-inf")

    # -- selection --------------------------------------------------------------------
    def _select(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        tokens = logits.argmax(dim=-1)
        rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if not rows:
            return tokens
        dev = logits.device
        idx = torch.tensor(rows, device=dev)
        params = [seqs[i].params for i in rows]
        sub = logits[idx] / torch.tensor([p.temperature for p in params], device=dev)[:, None]
        sub = _filter(sub, params)
        probs = torch.softmax(sub, dim=-1)
        q = torch.empty_like(probs)
        for r, i in enumerate(rows):
            gen = seqs[i].generator
            if gen is not None:
                q[r].exponential_(generator=gen)
        unseeded = [r for r, i in enumerate(rows) if seqs[i].generator is None]
        if unseeded:
            uidx = torch.tensor(unseeded, device=dev)
            q[uidx] = torch.empty(len(unseeded), probs.shape[-1], device=dev).exponential_()
        tokens[idx] = (probs / q).argmax(dim=-1)
        return tokens


def _filter(logits: torch.Tensor, params: list) -> torch.Tensor:  # type: ignore[type-arg]
    """Apply top-k, top-p and min-p masks in one sort."""
    need_k = any(p.top_k for p in params)
    need_p = any(p.top_p < 1.0 for p in params)
    need_min = any(p.min_p > 0 for p in params)
    if not (need_k or need_p or need_min):
        return logits
    vocab = logits.shape[-1]
    dev = logits.device
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    neg_inf = float("-inf")
    if need_k:
        k = torch.tensor([p.top_k if p.top_k else vocab for p in params], device=dev)[:, None]
        sorted_logits.masked_fill_(torch.arange(vocab, device=dev)[None, :] >= k, neg_inf)
    if need_p or need_min:
        probs = torch.softmax(sorted_logits, dim=-1)
        if need_p:
            top_p = torch.tensor([p.top_p for p in params], device=dev)[:, None]
            # Keep a token while the mass before it is below top_p (the first always stays).
            sorted_logits.masked_fill_((probs.cumsum(-1) - probs) >= top_p, neg_inf)
        if need_min:
            min_p = torch.tensor([p.min_p for p in params], device=dev)[:, None]
            sorted_logits.masked_fill_(probs < min_p * probs[:, :1], neg_inf)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _token_logprob(row: torch.Tensor, token: int, top_n: int) -> TokenLogprob:
    value = row[token]
    rank = int((row > value).sum()) + 1
    top: tuple[tuple[int, float], ...] = ()
    if top_n:
        vals, ids = row.topk(top_n)
        top = tuple(zip(ids.tolist(), vals.tolist()))
    return TokenLogprob(token, float(value), rank, top)
