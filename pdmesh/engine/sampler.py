"""Token selection, vectorised over the batch.

Order of operations (each step runs only when some row asks for it):
  raw log-softmax for logprobs → repetition / presence / frequency penalties → min_tokens
  (stop tokens masked) → the structured output's grammar (forbidden tokens masked) →
  greedy rows take the argmax; sampling rows are divided by their temperature, filtered
  by top-k, top-p and min-p, and drawn by inverting their cumulative distribution at one
  uniform number per row (``draw``). A seeded row draws that number
  from its own generator, so its tokens do not depend on what else shares the batch.

Logprobs are those of the raw model distribution (before penalties and temperature), the
quantity ``transformers`` reports as ``log_softmax(logits)``.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch

from pdmesh.engine.nucleus import filter_logits
from pdmesh.request import Sequence, TokenLogprob
from pdmesh.sampling_params import SamplingParams
from pdmesh.structured.grammars import Grammars
from pdmesh.structured.mask import apply_grammar_masks


class SamplingRow(Protocol):
    """What the sampler reads of a row: a ``Sequence``, or a ``RowView`` of one."""

    @property
    def params(self) -> SamplingParams: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def output_token_ids(self) -> list[int]: ...
    @property
    def num_output_tokens(self) -> int: ...
    @property
    def generator(self) -> Any: ...


@dataclass(slots=True)
class RowView:
    """A sequence as it would stand after ``extra`` more tokens.

    Speculative decoding samples position ``i`` of a draft as if drafts ``0..i-1`` had been
    accepted, so penalties and ``min_tokens`` see exactly the history a one-token-per-step
    decode would have seen there; that is what keeps greedy output identical.
    """

    seq: Sequence
    extra: list[int]

    @property
    def params(self) -> SamplingParams:
        return self.seq.params

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids + self.extra

    @property
    def output_token_ids(self) -> list[int]:
        return self.seq.output_token_ids + self.extra

    @property
    def num_output_tokens(self) -> int:
        return self.seq.num_output_tokens + len(self.extra)

    @property
    def generator(self) -> Any:
        return self.seq.generator


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


class Sampler:
    def __init__(self, eos_token_ids: Seq[int], grammars: Grammars | None = None) -> None:
        self.eos_token_ids = tuple(eos_token_ids)
        self.grammars = grammars

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: Seq[SamplingRow]) -> SamplerOutput:
        """``logits`` is float32 [len(seqs), vocab]; it is modified in place."""
        raw_logprobs = self.process(logits, seqs)
        token_list = self._select(logits, seqs).tolist()
        return SamplerOutput(token_list, self.logprobs_of(raw_logprobs, token_list, seqs))

    def process(self, logits: torch.Tensor, rows: Seq[SamplingRow]) -> torch.Tensor | None:
        """Apply penalties, ``min_tokens`` and structured outputs' grammars in place;
        returns the raw log-softmax when a row asks for logprobs (None otherwise)."""
        want = any(r.params.logprobs is not None for r in rows)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want else None
        self._apply_penalties(logits, rows)
        self._apply_min_tokens(logits, rows)
        if self.grammars is not None:
            apply_grammar_masks(logits, rows, self.grammars)
        return raw_logprobs

    @staticmethod
    def logprobs_of(
        raw_logprobs: torch.Tensor | None, tokens: Seq[int], rows: Seq[SamplingRow]
    ) -> list[TokenLogprob | None]:
        out: list[TokenLogprob | None] = [None] * len(rows)
        if raw_logprobs is not None:
            for i, row in enumerate(rows):
                if row.params.logprobs is not None:
                    out[i] = token_logprob(raw_logprobs[i], tokens[i], row.params.logprobs)
        return out

    @staticmethod
    def distribution(logits: torch.Tensor, params: Seq[SamplingParams]) -> torch.Tensor:
        """The probabilities a sampled row draws from: temperature, then top-k / top-p /
        min-p, then softmax (rows of processed logits, not modified)."""
        temps = torch.tensor([p.temperature for p in params], device=logits.device)[:, None]
        return torch.softmax(filter_logits(logits / temps, list(params)), dim=-1)

    # -- logits processors ------------------------------------------------------------
    @staticmethod
    def _apply_penalties(logits: torch.Tensor, seqs: Seq[SamplingRow]) -> None:
        """Repetition (over prompt and output, as transformers), presence and frequency
        (over the output, as OpenAI), on the (row, token) pairs that occur only, from each
        sequence's cached token tensor. Row by row over the whole vocabulary this took
        2.4 ms a step at batch 32 with 300-token contexts (docs/performance/log.md §20)."""
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
        every = [token_tensor(seqs[i], dev) for i in rows]
        at = torch.tensor(rows, device=dev)
        # Which penalties apply is decided from the parameters, not read back from a tensor.
        reps = [seqs[i].params.repetition_penalty for i in rows]
        if any(r != 1.0 for r in reps):
            row, tok = _pairs(every, vocab)
            target, r = at[row], torch.tensor(reps, device=dev, dtype=logits.dtype)[row]
            vals = logits[target, tok]
            logits[target, tok] = torch.where(vals > 0, vals / r, vals * r)
        freqs = [seqs[i].params.frequency_penalty for i in rows]
        presences = [seqs[i].params.presence_penalty for i in rows]
        if any(freqs) or any(presences):
            outputs = [t[len(t) - seqs[i].num_output_tokens:] for t, i in zip(every, rows)]
            row, tok, count = _pairs(outputs, vocab, counts=True)
            freq = torch.tensor(freqs, device=dev, dtype=logits.dtype)[row]
            pres = torch.tensor(presences, device=dev, dtype=logits.dtype)[row]
            target = at[row]
            logits[target, tok] = logits[target, tok] - freq * count.to(logits.dtype) - pres

    def _apply_min_tokens(self, logits: torch.Tensor, seqs: Seq[SamplingRow]) -> None:
        for i, seq in enumerate(seqs):
            p = seq.params
            if seq.num_output_tokens < p.min_tokens:
                stops = list(p.stop_token_ids)
                if not p.ignore_eos:
                    stops.extend(self.eos_token_ids)
                if stops:
                    logits[i, stops] = float("-inf")

    # -- selection --------------------------------------------------------------------
    def _select(self, logits: torch.Tensor, seqs: Seq[SamplingRow]) -> torch.Tensor:
        tokens = logits.argmax(dim=-1)
        rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if not rows:
            return tokens
        idx = torch.tensor(rows, device=logits.device)
        probs = self.distribution(logits[idx], [seqs[i].params for i in rows])
        tokens[idx] = draw(probs, [seqs[i].generator for i in rows])
        return tokens


def _pairs(token_rows: list[torch.Tensor], vocab: int, counts: bool = False) -> tuple[torch.Tensor, ...]:
    """The distinct (row, token) pairs of ``token_rows`` as two index tensors; with
    ``counts``, of the ids the logits cover, with how often each occurs (frequency and
    presence count the output), else with ids past them taken as the last one (what the
    repetition penalty has always done)."""
    device = token_rows[0].device
    ids = torch.cat(token_rows)
    offsets = torch.repeat_interleave(torch.arange(len(token_rows), device=device) * vocab,
                                      torch.tensor([len(t) for t in token_rows], device=device))
    if counts:
        keys, times = torch.unique((ids + offsets)[ids < vocab], return_counts=True)
        return keys // vocab, keys % vocab, times
    keys = torch.unique(ids.clamp_max(vocab - 1) + offsets)
    return keys // vocab, keys % vocab


def token_tensor(row: SamplingRow, device: torch.device) -> torch.Tensor:
    """A row's ``token_ids`` as a tensor. A sequence keeps it with the list it was made
    from and converts only the tokens appended since (a sequence's list only grows); a
    list replaced, or one whose last cached token changed, is converted whole. A
    ``RowView`` adds its draft tokens."""
    # Rows other than a RowView are the engine's own sequences, which carry the cache.
    seq = row.seq if isinstance(row, RowView) else cast(Sequence, row)
    ids = seq.token_ids
    source, cached, last = seq.token_tensor or (None, None, None)
    n = 0 if cached is None else len(cached)
    if (cached is None or source is not ids or cached.device != device or n > len(ids)
            or (n and last != ids[n - 1])):
        cached = torch.tensor(ids, dtype=torch.long, device=device)
    elif n < len(ids):
        cached = torch.cat([cached, torch.tensor(ids[n:], dtype=torch.long, device=device)])
    seq.token_tensor = (ids, cached, ids[-1] if ids else None)  # an int: no device read to check it
    if isinstance(row, RowView) and row.extra:
        return torch.cat([cached, torch.tensor(row.extra, dtype=torch.long, device=device)])
    return cached


def draw(probs: torch.Tensor, generators: Seq[Any]) -> torch.Tensor:
    """One token per row from (unnormalised) ``probs``: the first whose cumulative mass
    exceeds a uniform fraction of the row's total, one number per row (from the row's
    generator when it has one). The exponential race (``argmax(p / q)``, ``q ~ Exp(1)``)
    used before drew a number per vocabulary entry: 3.8 ms a step for 32 rows of 8,192
    on 2 cores, 60 ms at a 128k vocabulary (docs/performance/log.md §20)."""
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1:]
    # Below the total, so the token found has mass (a filtered token's cdf is flat).
    target = torch.minimum(uniforms(generators, probs.device) * total,
                           torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


def uniforms(generators: Seq[Any], device: torch.device) -> torch.Tensor:
    """A float64 column of numbers in [0, 1), one per row: the row's ``seeded_uniform``,
    or one of torch's for rows without a generator."""
    n = len(generators)
    u = (torch.rand(n, 1, dtype=torch.float64, device=device) if None in generators
         else torch.empty(n, 1, dtype=torch.float64, device=device))
    for r, gen in enumerate(generators):
        if gen is not None:
            u[r] = seeded_uniform(gen, device)
    return u


def seeded_uniform(generator: Any, device: torch.device | str) -> torch.Tensor:
    """The number a seeded row draws for one token. Called without sampling, it advances
    the generator past a token as ``draw`` would have: a request resumed from tokens
    another worker drew goes on with exactly the tokens an uninterrupted run draws next."""
    return torch.rand(1, dtype=torch.float64, device=device, generator=generator)


def token_logprob(row: torch.Tensor, token: int, top_n: int) -> TokenLogprob:
    """``token``'s logprob in ``row`` (a log-softmax), its rank, and the ``top_n`` best."""
    value = row[token]
    rank = int((row > value).sum()) + 1
    top: tuple[tuple[int, float], ...] = ()
    if top_n:
        vals, ids = row.topk(top_n)
        top = tuple(zip(ids.tolist(), vals.tolist()))
    return TokenLogprob(token, float(value), rank, top)
