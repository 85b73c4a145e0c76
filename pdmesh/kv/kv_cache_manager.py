"""Per-sequence KV block bookkeeping on top of the ``BlockPool``.

The scheduler speaks to this class only: which prompt blocks are already cached
(``get_computed_blocks``), make room for the next tokens (``allocate_slots``, ``None``-free
capacity semantics: it returns False when the pool is full), register computed blocks as
prefix cache (``cache_blocks``), share blocks with a forked sibling (``fork``) and give
everything back (``free``). Copy-on-write happens inside ``allocate_slots``: writing into a
shared, partially filled block first copies it, and the copy is reported to the model
runner through ``take_copies``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdmesh.kv.block_hash import BlockHash, BlockHasher
from pdmesh.kv.block_pool import BlockPool, BlockPoolStats
from pdmesh.kv.free_queue import KVBlock
from pdmesh.request import Sequence


@dataclass(frozen=True, slots=True)
class BlockCopy:
    """Copy one block's KV (all layers) before a sequence writes into its private copy."""

    src: int
    dst: int


class KVCacheManager:
    """Owns the mapping sequence → blocks and keeps the pool's ref counts right."""

    def __init__(self, pool: BlockPool, hasher: BlockHasher) -> None:
        self.pool = pool
        self.hasher = hasher
        self.block_size = hasher.block_size
        self._blocks: dict[str, list[KVBlock]] = {}
        self._ids: dict[str, list[int]] = {}
        """Each sequence's block ids as of its blocks' last change (``block_table``)."""
        self._num_registered: dict[str, int] = {}
        self._copies: list[BlockCopy] = []

    # -- queries ----------------------------------------------------------------------
    def block_ids(self, seq: Sequence) -> list[int]:
        return list(self.block_table(seq))

    def block_table(self, seq: Sequence) -> list[int]:
        """``seq``'s block ids, not to be changed by the caller: the list is kept between
        steps and extended as blocks are added, so the model runner's per-step read costs
        nothing (a list over the blocks was ~3 us a sequence, every step)."""
        ids = self._ids.get(seq.seq_id)
        if ids is None:
            blocks = self._blocks.get(seq.seq_id)
            if blocks is None:
                return []  # nothing to keep: a sequence without blocks is never freed here
            ids = self._ids[seq.seq_id] = [b.block_id for b in blocks]
        return ids

    def block_ids_of_sequences(self, seq_ids: set[str]) -> set[int]:
        """Distinct blocks held by these sequences."""
        return {b.block_id for sid, blocks in self._blocks.items() if sid in seq_ids for b in blocks}

    def num_sequences(self) -> int:
        return len(self._blocks)

    def stats(self) -> BlockPoolStats:
        return self.pool.stats()

    def ensure_hashes(self, seq: Sequence, num_blocks: int) -> None:
        have = len(seq.block_hashes)
        if have >= num_blocks:
            return
        bs = self.block_size
        parent = seq.block_hashes[-1] if have else None
        seq.block_hashes.extend(
            self.hasher.hash_tokens(
                seq.token_ids[: num_blocks * bs], seq.extra_keys, parent=parent, start=have * bs
            )
        )

    def uncached_hashes(self, seqs: list[Sequence]) -> set[BlockHash]:
        """Hashes of blocks these sequences hold (or will fill) that are not cached yet."""
        pending: set[BlockHash] = set()
        for seq in seqs:
            pending.update(seq.block_hashes[self._num_registered.get(seq.seq_id, 0) :])
        return pending

    def get_computed_blocks(self, seq: Sequence) -> list[KVBlock]:
        """Cached blocks covering the longest prefix of ``seq``, verified against token ids.

        The last token is always recomputed (its logits are needed), so at most
        ``num_tokens - 1`` tokens hit.
        """
        if not self.pool.enable_caching or seq.params.prompt_logprobs is not None:
            return []  # prompt logprobs need every prompt position's logits: recomputed
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        self.ensure_hashes(seq, max_blocks)
        hits: list[KVBlock] = []
        for i in range(max_blocks):
            block = self.pool.lookup(seq.block_hashes[i], seq.token_ids[i * bs : (i + 1) * bs])
            if block is None:
                break
            hits.append(block)
        return hits

    # -- allocation -------------------------------------------------------------------
    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, computed: list[KVBlock] | None = None
    ) -> bool:
        """Make room for ``num_new_tokens`` after the computed prefix; False if the pool is full.

        ``computed`` are prefix-cache hits from ``get_computed_blocks``; on success they
        become the sequence's first blocks and ``seq.num_computed_tokens`` is advanced past
        them. On failure nothing changes.
        """
        computed = computed or []
        blocks = self._blocks.get(seq.seq_id, [])
        if computed and blocks:
            raise RuntimeError(f"{seq.seq_id}: prefix hits offered to a sequence that has blocks")
        bs = self.block_size
        start = seq.num_computed_tokens + len(computed) * bs
        total_blocks = -(-(start + num_new_tokens) // bs)
        num_new_blocks = max(0, total_blocks - len(blocks) - len(computed))
        cow_index = start // bs if start % bs else -1
        needs_cow = 0 <= cow_index < len(blocks) and blocks[cow_index].ref_cnt > 1
        revived = sum(1 for b in computed if b.ref_cnt == 0)
        if num_new_blocks + needs_cow > self.pool.num_free_blocks - revived:
            return False
        if computed:
            self.pool.touch(computed, reuse=True)
            blocks = list(computed)
            seq.num_computed_tokens = start
            self._num_registered[seq.seq_id] = len(computed)
        if computed or needs_cow:
            self._ids.pop(seq.seq_id, None)
        if needs_cow:
            self._copy_on_write(blocks, cow_index)
        if num_new_blocks:
            new = self.pool.get_new_blocks(num_new_blocks)
            if new is None:
                raise RuntimeError("free-block count changed during allocation")
            blocks.extend(new)
            if (ids := self._ids.get(seq.seq_id)) is not None:
                ids.extend(b.block_id for b in new)
        self._blocks[seq.seq_id] = blocks
        return True

    def _copy_on_write(self, blocks: list[KVBlock], index: int) -> None:
        shared = blocks[index]
        new = self.pool.get_new_blocks(1)
        if new is None:
            raise RuntimeError("copy-on-write found no free block after reserving one")
        self.pool.free_blocks([shared])
        blocks[index] = new[0]
        self._copies.append(BlockCopy(shared.block_id, new[0].block_id))

    def take_copies(self) -> list[BlockCopy]:
        """Block copies the model runner must perform before this step's writes."""
        copies, self._copies = self._copies, []
        return copies

    def cache_blocks(self, seq: Sequence) -> None:
        """Register every full, computed block of ``seq`` as a prefix-cache entry; a block
        whose content another block already holds in the cache is swapped for that one
        (``_share_duplicates``)."""
        if not self.pool.enable_caching:
            return
        blocks = self._blocks.get(seq.seq_id)
        if blocks is None:
            return
        bs = self.block_size
        num_full = min(seq.num_computed_tokens // bs, len(blocks))
        done = self._num_registered.get(seq.seq_id, 0)
        if num_full <= done:
            return
        self.ensure_hashes(seq, num_full)
        self._share_duplicates(seq, blocks, done, num_full)
        self.pool.cache_blocks(
            blocks[done:num_full],
            seq.block_hashes[done:num_full],
            [seq.token_ids[i * bs : (i + 1) * bs] for i in range(done, num_full)],
            seq.block_hashes[done - 1] if done else None,
        )
        self._num_registered[seq.seq_id] = num_full

    def _share_duplicates(self, seq: Sequence, blocks: list[KVBlock], start: int, end: int) -> None:
        """Swap each of ``blocks[start:end]`` (full, computed, just now) that only this
        sequence holds for the cached block with the same hash and tokens, and free it.

        Requests that arrive together reserve a shared prefix on a decode worker before
        any of their KV has landed there (the scheduler keeps a prompt waiting while
        another computes its prefix; a reservation cannot wait), so a decode worker held
        one copy of a system prompt per request: as many times the memory, and decode
        attention reading each copy (it reads blocks shared by several sequences once:
        csrc/paged_attention.cpp). Safe here because a full block is never written
        again, and nothing has read this block's id yet: it became full in the step (or
        the KV transfer) that just ended, before any sender or offload reads the
        sequence's blocks.
        """
        bs = self.block_size
        for i in range(start, end):
            block = blocks[i]
            if block.block_hash is not None or block.ref_cnt != 1:
                continue  # already the cache entry, or shared with a fork
            held = self.pool.lookup(seq.block_hashes[i], seq.token_ids[i * bs : (i + 1) * bs])
            if held is None or held is block:
                continue
            self.pool.touch([held], reuse=True)
            blocks[i] = held
            self._ids.pop(seq.seq_id, None)
            self.pool.free_blocks([block])

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Free the blocks past the first ``num_tokens`` tokens (rejected draft tokens'
        slots). Those blocks were allocated this step for drafts, so none is cached or
        shared; a block still partly in use keeps its stale tail, which the next write
        overwrites and attention never reads."""
        blocks = self._blocks.get(seq.seq_id)
        keep = -(-num_tokens // self.block_size)
        if blocks is None or len(blocks) <= keep:
            return
        surplus = blocks[keep:]
        del blocks[keep:]
        self._ids.pop(seq.seq_id, None)
        self.pool.free_blocks(reversed(surplus))

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give ``child`` the parent's blocks, shared (ref count +1 each)."""
        blocks = self._blocks.get(parent.seq_id)
        if blocks is None:
            raise RuntimeError(f"cannot fork {parent.seq_id}: it holds no blocks")
        if child.seq_id in self._blocks:
            raise RuntimeError(f"{child.seq_id} already holds blocks")
        self.pool.touch(blocks)
        self._blocks[child.seq_id] = list(blocks)
        self._num_registered[child.seq_id] = self._num_registered.get(parent.seq_id, 0)
        child.block_hashes = list(parent.block_hashes)

    def free(self, seq: Sequence) -> None:
        """Release every block of ``seq`` (tail first, so shared roots are evicted last)."""
        blocks = self._blocks.pop(seq.seq_id, None)
        self._ids.pop(seq.seq_id, None)
        self._num_registered.pop(seq.seq_id, None)
        if blocks:
            self.pool.free_blocks(reversed(blocks))
