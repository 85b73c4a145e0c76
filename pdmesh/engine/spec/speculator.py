"""Speculative decoding inside the engine step.

Before a step, ``propose`` gives every running decode sequence up to k draft tokens
(``Sequence.spec_token_ids``); the scheduler makes room for them and the model runner
verifies them as extra decode rows. After the forward pass, ``verify`` turns the k + 1
rows of logits into the tokens to commit. Speculation switches itself off while
``disable_by_batch_size`` or more sequences run: a large batch is no longer dominated by
per-step costs, and verifying drafts would only add work.

Each sequence also adapts to how predictable its text is, since every draft row costs a
row of the verification pass and a batch runs as long as its slowest sequence: its draft
length grows by one after a fully accepted run (up to k) and shrinks to what was accepted
plus one after a partial one; after a verification that accepts nothing it skips 1, 2, 4
... up to ``MAX_BACKOFF`` steps before proposing again, so text that nothing predicts
(sampling at a high temperature, say) costs next to nothing.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from pdmesh.config import MAX_SPECULATIVE_TOKENS, EngineConfig, SpeculativeConfig
from pdmesh.engine.sampler import RowView, Sampler, SamplingRow
from pdmesh.engine.spec.rejection import accept_greedy, accept_sampled
from pdmesh.request import SeqStatus, Sequence, TokenLogprob


@dataclass(slots=True)
class Verified:
    """What one sequence commits after a step."""

    tokens: list[int]
    logprobs: list[TokenLogprob | None]
    num_drafts: int = 0
    num_accepted: int = 0


@dataclass(slots=True)
class SpecStats:
    """Worker-wide totals (Prometheus reads them)."""

    draft_tokens: int = 0
    accepted_tokens: int = 0
    steps: int = 0
    accepted_counts: list[int] = field(default_factory=lambda: [0] * (MAX_SPECULATIVE_TOKENS + 1))
    """``accepted_counts[a]``: verification steps that accepted ``a`` drafts."""


MAX_BACKOFF = 16


@dataclass(slots=True)
class _Adaptive:
    """One sequence's speculation state."""

    k: int
    """Drafts to ask for next time."""
    misses: int = 0
    """Verifications in a row that accepted no draft."""
    skip: int = 0
    """Steps left before this sequence proposes again."""

    def update(self, drafted: int, accepted: int, max_k: int) -> None:
        self.k = min(max_k, self.k + 1) if accepted == drafted else max(1, accepted + 1)
        self.misses = 0 if accepted else self.misses + 1
        self.skip = min(MAX_BACKOFF, 2 ** (self.misses - 1)) if self.misses else 0


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: object, max_model_len: int) -> None:
        self.config = config
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.stats = SpecStats()
        self._adaptive: dict[str, _Adaptive] = {}

    def retain(self, live: set[str]) -> None:
        """Let the proposer drop per-sequence state (draft KV) of sequences that ended."""
        for seq_id in [s for s in self._adaptive if s not in live]:
            del self._adaptive[seq_id]
        release = getattr(self.proposer, "retain", None)
        if release is not None:
            release(live)

    # -- before the step --------------------------------------------------------------
    def propose(self, running: Seq[Sequence], sampler: Sampler) -> None:
        """Set draft tokens on the running sequences that are decoding."""
        if len(running) >= self.config.disable_by_batch_size or not running:
            return
        wanted: list[tuple[Sequence, int]] = []
        for seq in running:
            if seq.status is not SeqStatus.RUNNING or seq.fork_pending:
                continue
            if seq.num_tokens - seq.num_computed_tokens != 1:
                continue  # still prefilling
            state = self._adaptive.get(seq.seq_id)
            if state is not None and state.skip > 0:
                state.skip -= 1
                continue
            asked = seq.params.num_speculative_tokens
            k = min(
                self.config.num_speculative_tokens if asked is None else asked,
                state.k if state is not None else self.config.num_speculative_tokens,
                seq.params.max_tokens - seq.num_output_tokens - 1,  # no draft past max_tokens
                self.max_model_len - seq.num_tokens,  # positions stay inside the model
            )
            if k > 0:
                wanted.append((seq, k))
        if wanted:
            self.proposer.propose(wanted, sampler)  # type: ignore[attr-defined]

    # -- after the forward pass ---------------------------------------------------------
    @torch.inference_mode()
    def verify(
        self, sampler: Sampler, logits: torch.Tensor, seqs: list[Sequence], drafts: list[list[int]]
    ) -> list[Verified]:
        """``logits`` holds ``len(drafts[i]) + 1`` rows per sequence, in order. Sequences
        without drafts take the sampler's batched path; the others are verified one by one."""
        out: list[Verified | None] = [None] * len(seqs)
        plain_rows: list[int] = []
        plain: list[int] = []
        row = 0
        for i, d in enumerate(drafts):
            if d:
                out[i] = self._verify_one(sampler, logits[row : row + len(d) + 1], seqs[i], d)
            else:
                plain_rows.append(row)
                plain.append(i)
            row += len(d) + 1
        if plain:
            sampled = sampler(logits[torch.tensor(plain_rows)], [seqs[i] for i in plain])
            for i, token, lp in zip(plain, sampled.token_ids, sampled.logprobs):
                out[i] = Verified([token], [lp])
        return out  # type: ignore[return-value]

    def _verify_one(self, sampler: Sampler, logits: torch.Tensor, seq: Sequence, d: list[int]) -> Verified:
        rows: list[SamplingRow] = [seq, *(RowView(seq, d[:i]) for i in range(1, len(d) + 1))]
        raw = sampler.process(logits, rows)
        if seq.params.greedy:
            tokens = accept_greedy(d, logits.argmax(dim=-1).tolist())
        else:
            p = sampler.distribution(logits, [seq.params] * len(rows))
            q = seq.spec_draft_probs[: len(d)] if seq.spec_draft_probs is not None else None
            tokens = accept_sampled(p, d, q, seq.generator)
        seq.spec_draft_probs = None
        lps = sampler.logprobs_of(raw[: len(tokens)] if raw is not None else None, tokens,
                                  rows[: len(tokens)])
        accepted = len(tokens) - 1
        k_max = self.config.num_speculative_tokens
        self._adaptive.setdefault(seq.seq_id, _Adaptive(k_max)).update(len(d), accepted, k_max)
        self.stats.draft_tokens += len(d)
        self.stats.accepted_tokens += accepted
        self.stats.steps += 1
        self.stats.accepted_counts[accepted] += 1
        return Verified(tokens, lps, len(d), accepted)

def build_speculator(
    config: EngineConfig, vocab_size: int, num_blocks: int, max_model_len: int
) -> Speculator | None:
    spec = config.speculative
    if spec is None:
        return None
    if spec.method == "ngram":
        from pdmesh.engine.spec.ngram import NgramProposer

        return Speculator(spec, NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max), max_model_len)
    from pdmesh.engine.spec.draft import DraftModelProposer

    proposer = DraftModelProposer(spec, config, vocab_size, num_blocks, max_model_len)
    return Speculator(spec, proposer, max_model_len)
