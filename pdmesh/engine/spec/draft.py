"""Drafts from a small model with the target's tokenizer, run inside the same worker.

The draft has its own weights, ``ModelRunner`` and paged KV pool (as many blocks as the
target's, each far smaller), and a shadow sequence per target sequence holding exactly
the tokens whose KV the draft has computed. Each engine step it first catches up on what
the target committed since (the whole prompt the first time: the draft prefills its own
KV, so a hand-off from a prefill worker needs nothing extra), then runs k - 1 one-token
steps, all sequences batched. After verification the shadow keeps the accepted drafts'
KV and recomputes from the first rejected position.

Drafts are sampled under the request's own options (penalties, temperature, top-k/p,
min-p) so ``q`` and the target's ``p`` are comparable; greedy requests draft greedily.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdmesh.attention.select import build_backend
from pdmesh.config import EngineConfig, SpeculativeConfig
from pdmesh.engine.model_runner import ModelRunner
from pdmesh.engine.sampler import RowView, Sampler, draw
from pdmesh.engine.scheduler import ScheduledSeq, SchedulerOutput
from pdmesh.errors import InvalidRequestError
from pdmesh.kv.block_hash import BlockHasher
from pdmesh.kv.block_pool import BlockPool, BlockPoolStats
from pdmesh.kv.kv_cache_manager import KVCacheManager
from pdmesh.model.loader import load_model
from pdmesh.request import Sequence


@dataclass(slots=True)
class _Shadow:
    seq: Sequence
    """The draft's copy: ``token_ids`` are exactly the tokens with KV in the draft pool."""
    drafts: list[int]
    """What it proposed last, to tell after verification how much of its KV survives."""
    real_len: int
    """The target sequence's length when those drafts were proposed."""


class DraftModelProposer:
    def __init__(
        self, spec: SpeculativeConfig, target: EngineConfig, target_vocab: int, num_blocks: int,
        max_model_len: int,
    ) -> None:
        model, cfg, dtype = load_model(spec.model or "", target.dtype, target.device, max_model_len)
        if cfg.vocab_size != target_vocab:
            raise InvalidRequestError(
                "speculative_config.model",
                f"the draft's vocabulary has {cfg.vocab_size} tokens, the target's {target_vocab}: "
                "a draft must share the target's tokenizer",
            )
        bs = target.cache.block_size
        self.pool = BlockPool(num_blocks, enable_caching=False)
        self.kv = KVCacheManager(self.pool, BlockHasher(bs, 0, target.cache.hash_algorithm))
        backend = build_backend(target.attention_backend, target.device, dtype, cfg.head_dim, cfg.attention_variants)
        self.runner = ModelRunner(model, cfg, dtype, num_blocks, bs, self.kv, backend, target.device)
        self._shadows: dict[str, _Shadow] = {}

    def stats(self) -> BlockPoolStats:
        return self.pool.stats()

    def retain(self, live: set[str]) -> None:
        """Free the draft KV of sequences that are no longer running."""
        for seq_id in [s for s in self._shadows if s not in live]:
            self.kv.free(self._shadows.pop(seq_id).seq)

    @torch.inference_mode()
    def propose(self, wanted: list[tuple[Sequence, int]], sampler: Sampler) -> None:
        active: list[tuple[Sequence, int, _Shadow]] = []
        items: list[ScheduledSeq] = []
        for seq, k in wanted:
            shadow = self._catch_up(seq)
            num_new = seq.num_tokens - shadow.seq.num_computed_tokens
            if not self.kv.allocate_slots(shadow.seq, num_new + k - 1):
                self.kv.free(self._shadows.pop(seq.seq_id).seq)  # no room: no drafts this step
                continue
            items.append(ScheduledSeq(shadow.seq, num_new, shadow.seq.num_computed_tokens))
            active.append((seq, k, shadow))
        drafts: list[list[int]] = [[] for _ in active]
        probs: list[list[torch.Tensor]] = [[] for _ in active]
        for i in range(max((k for _, k, _ in active), default=0)):
            if i:
                items = [ScheduledSeq(sh.seq, 1, sh.seq.num_tokens - 1)
                         for (_, k, sh) in active if k > i]
            result = self.runner.forward(self.runner.prepare(SchedulerOutput(items)))
            running = [(j, a) for j, a in enumerate(active) if a[1] > i]
            # The runner puts one-token rows first; read the rows back in ``running`` order.
            row_of = {id(s): r for r, s in enumerate(result.sampling)}
            logits = result.logits[torch.tensor([row_of[id(a[2].seq)] for _, a in running])]
            picked = self._pick(sampler, logits, running, drafts)
            for (j, (_, _, shadow)), token, p in zip(running, *picked):
                drafts[j].append(token)
                if p is not None:
                    probs[j].append(p)
                shadow.seq.num_computed_tokens = shadow.seq.num_tokens
                shadow.seq.token_ids.append(token)
        for j, (seq, _, shadow) in enumerate(active):
            # The last draft was never fed back: the shadow holds KV for all but it.
            shadow.seq.token_ids.pop()
            shadow.drafts, shadow.real_len = drafts[j], seq.num_tokens
            seq.spec_token_ids = drafts[j]
            seq.spec_draft_probs = torch.stack(probs[j]) if probs[j] else None

    def _catch_up(self, seq: Sequence) -> _Shadow:
        """The shadow of ``seq``, cut back to the longest prefix the draft computed right."""
        shadow = self._shadows.get(seq.seq_id)
        if shadow is None:
            copy = Sequence(seq.seq_id, seq.request_id, seq.index, seq.params, seq.prompt_len, [],
                            seq.arrival_time)
            shadow = self._shadows[seq.seq_id] = _Shadow(copy, [], 0)
        valid = shadow.real_len
        for draft, token in zip(shadow.drafts, seq.token_ids[valid:]):
            if draft != token:
                break
            valid += 1
        valid = min(valid, len(shadow.seq.token_ids), seq.num_tokens - 1)
        shadow.seq.token_ids = list(seq.token_ids)
        shadow.seq.num_computed_tokens = valid
        self.kv.trim(shadow.seq, valid)
        return shadow

    @staticmethod
    def _pick(
        sampler: Sampler, logits: torch.Tensor, running: list[tuple[int, tuple[Sequence, int, _Shadow]]],
        drafts: list[list[int]],
    ) -> tuple[list[int], list[torch.Tensor | None]]:
        """The next draft per sequence, under its own sampling options, and ``q`` for it."""
        rows = [RowView(seq, drafts[j]) for j, (seq, _, _) in running]
        sampler.process(logits, rows)
        tokens = logits.argmax(dim=-1).tolist()
        probs: list[torch.Tensor | None] = [None] * len(rows)
        sampled = [r for r, row in enumerate(rows) if not row.params.greedy]
        if sampled:
            dist = sampler.distribution(logits[torch.tensor(sampled)], [rows[r].params for r in sampled])
            drawn = draw(dist, [rows[r].generator for r in sampled]).tolist()
            for i, r in enumerate(sampled):
                tokens[r], probs[r] = drawn[i], dist[i]
        return tokens, probs
