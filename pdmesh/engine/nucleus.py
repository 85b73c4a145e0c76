"""Top-k, top-p and min-p: which tokens a sampled row may draw (``filter_logits``).

Each row's best tokens are looked at first instead of sorting its vocabulary
(docs/performance/log.md §20).
"""

from __future__ import annotations

import torch

HEADS = (64, 1024, 16384)
"""How many of a row's best tokens top-k / top-p look at, in turn, before sorting the row
whole (``filter_logits``; a head as wide as the row is skipped): ``topk`` of 32 rows of 8,192
took 0.3 ms for 64 and 1.6 ms for 1,024 on 2 cores against 6.7 ms for a full sort, and of
32 rows of 128,256 29 ms for 16,384 against 136 ms."""


def filter_logits(logits: torch.Tensor, params: list) -> torch.Tensor:
    """Top-k, top-p and min-p (a dropped token's logit becomes -inf), on the head of each
    row instead of a sorted vocabulary: sorting took 6.7 ms a step for 32 rows of 8,192 on
    2 cores, 136 ms at a 128k vocabulary (docs/performance/log.md §20). A row's head is its
    ``max(HEADS[0], top_k)`` best tokens; top-p's cut is found there when the head holds at
    least ``top_p`` of the row's mass (after top-k, as always); a row where it does not
    tries the next head, and is sorted whole past the last (``filter_logits_sorted``).
    min-p needs no order: a token is dropped when its probability is below ``min_p`` times
    the best one's, i.e. its logit below the best logit plus ``log(min_p)``."""
    need_k = any(p.top_k for p in params)
    need_p = any(p.top_p < 1.0 for p in params)
    need_min = any(p.min_p > 0 for p in params)
    if not (need_k or need_p or need_min):
        return logits
    dev = logits.device
    keep = torch.ones_like(logits, dtype=torch.bool)
    if need_min:
        min_p = torch.tensor([p.min_p for p in params], device=dev)[:, None]
        keep &= logits >= logits.max(dim=-1, keepdim=True).values + torch.log(min_p)
    rows = [i for i, p in enumerate(params) if p.top_k or p.top_p < 1.0]
    if rows:
        idx = torch.tensor(rows, device=dev)
        keep[idx] &= _head_keep(logits[idx], [params[i] for i in rows])
    return logits.masked_fill(~keep, float("-inf"))


def _head_keep(logits: torch.Tensor, params: list, heads: tuple[int, ...] = HEADS) -> torch.Tensor:
    """Which tokens top-k and top-p keep, for rows that ask for either."""
    vocab = logits.shape[-1]
    dev = logits.device
    ks = [p.top_k if p.top_k and p.top_k < vocab else vocab for p in params]
    head = min(vocab, max([heads[0]] + [k for k in ks if k < vocab]))
    vals, order = logits.topk(head, dim=-1)  # sorted, best first
    k = torch.tensor(ks, device=dev)[:, None]
    has_k = k < vocab
    in_k = torch.arange(head, device=dev)[None, :] < k
    vals = vals.masked_fill(~in_k, float("-inf"))
    # Probabilities after top-k: over the head when the row has a top-k (every kept token
    # is in it), over the whole row otherwise. (softmax, not exp(x - logsumexp): on a
    # peaked row most exponentials are denormal, and torch's exp took 1.1 ms for 32 rows
    # of 8,192 where softmax took 0.12.)
    with_k = sum(n < vocab for n in ks)  # from the list: no device read to decide
    if with_k == len(ks):
        probs = torch.softmax(vals, dim=-1)
    elif with_k == 0:
        probs = torch.softmax(logits, dim=-1).gather(1, order)
    else:
        probs = torch.where(has_k, torch.softmax(vals, dim=-1), torch.softmax(logits, dim=-1).gather(1, order))
    top_p = torch.tensor([p.top_p for p in params], device=dev)[:, None]
    head_keep = in_k & _within_top_p(probs, top_p)
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, order, head_keep)
    mass = probs.sum(dim=-1)
    covered = has_k[:, 0] | (mass >= top_p[:, 0])
    if bool(covered.all()):
        return keep
    # The cut lies beyond the head. Probabilities only fall along a sorted row, so the next
    # head holds at most (next / head) times this one's mass: rows it cannot cover either
    # are sorted whole at once.
    wider = heads[1] if len(heads) > 1 and heads[1] < vocab else 0
    reachable = mass * (wider / head) >= top_p[:, 0]
    for rows, next_heads in ((~covered & reachable, heads[1:]), (~covered & ~reachable, ())):
        if bool(rows.any()):
            sel = rows.nonzero()[:, 0]
            sub, sub_params = logits[sel], [params[int(i)] for i in sel]
            keep[sel] = (_head_keep(sub, sub_params, next_heads) if next_heads
                         else torch.isfinite(filter_logits_sorted(sub, sub_params)))
    return keep


def filter_logits_sorted(logits: torch.Tensor, params: list) -> torch.Tensor:
    """Top-k and top-p over the whole sorted row (the rows ``_head_keep`` cannot settle)."""
    vocab = logits.shape[-1]
    dev = logits.device
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    neg_inf = float("-inf")
    k = torch.tensor([p.top_k if p.top_k else vocab for p in params], device=dev)[:, None]
    sorted_logits.masked_fill_(torch.arange(vocab, device=dev)[None, :] >= k, neg_inf)
    probs = torch.softmax(sorted_logits, dim=-1)
    top_p = torch.tensor([p.top_p for p in params], device=dev)[:, None]
    sorted_logits.masked_fill_(~_within_top_p(probs, top_p), neg_inf)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _within_top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Over probabilities sorted best first: keep a token while the mass before it is
    below its row's ``top_p`` (the first always stays; a row at 1 keeps every token, also
    where rounding brings the mass before the last ones to 1)."""
    return ((probs.cumsum(dim=-1) - probs) < top_p) | (top_p >= 1.0)
