import torch

from pdmesh.engine.nucleus import filter_logits
from pdmesh.engine.sampler import Sampler
from pdmesh.request import Sequence
from pdmesh.sampling_params import SamplingParams


def seq(params: SamplingParams, prompt: list[int], out: list[int] = ()) -> Sequence:  # type: ignore[assignment]
    s = Sequence("s", "s", 0, params, len(prompt), list(prompt) + list(out), 0.0)
    if params.seed is not None:
        s.generator = torch.Generator().manual_seed(params.seed)
    return s


def test_top_k_top_p_min_p_masks() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3))
    params = [SamplingParams(top_k=2), SamplingParams(top_p=0.8), SamplingParams(min_p=0.25)]
    kept = torch.isfinite(filter_logits(logits.clone(), params))
    assert kept.tolist() == [
        [True, True, False, False],
        [True, True, False, False],  # 0.5 + 0.3 reaches 0.8: the third token is cut
        [True, True, True, False],  # 0.05 < 0.25 * 0.5
    ]


def test_penalties_match_transformers_processors() -> None:
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(0)
    logits = torch.randn(1, 10)
    prompt, out = [1, 2], [3, 3, 4]
    ours = logits.clone()
    Sampler(())._apply_penalties(ours, [seq(SamplingParams(repetition_penalty=1.3), prompt, out)])
    ref = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + out]), logits.clone())
    assert torch.equal(ours, ref)
    ours = logits.clone()
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    Sampler(())._apply_penalties(ours, [seq(p, prompt, out)])
    expected = logits.clone()
    expected[0, 3] -= 0.5 + 2 * 0.25
    expected[0, 4] -= 0.5 + 0.25
    assert torch.allclose(ours, expected)


def test_min_tokens_masks_eos_and_stop_ids() -> None:
    logits = torch.zeros(1, 6)
    logits[0, 5] = 10.0  # EOS would win
    s = seq(SamplingParams(temperature=0, min_tokens=2, stop_token_ids=(4,)), [1])
    out = Sampler((5,))(logits.clone(), [s])
    assert out.token_ids[0] not in (4, 5)


def test_seeded_row_is_independent_of_the_batch() -> None:
    torch.manual_seed(1)
    logits = torch.randn(1, 50)
    p = SamplingParams(temperature=1.0, seed=1234)
    alone = [Sampler(())(logits.clone(), [seq(p, [1])]).token_ids[0] for _ in range(1)]
    others = torch.randn(3, 50)
    batch = torch.cat([others[:2], logits, others[2:]])
    rows = [seq(SamplingParams(temperature=0.7), [1]), seq(SamplingParams(temperature=0), [1]),
            seq(p, [1]), seq(SamplingParams(temperature=1.0, seed=5), [1])]
    assert Sampler(())(batch.clone(), rows).token_ids[2] == alone[0]


def test_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = torch.log(probs).repeat(4000, 1)
    g = SamplingParams(temperature=1.0, seed=7)
    s = seq(g, [0])
    tokens = [Sampler(())(logits[i : i + 1].clone(), [s]).token_ids[0] for i in range(4000)]
    freq = torch.bincount(torch.tensor(tokens), minlength=3).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03)


def test_logprobs_report_rank_and_top_n() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    out = Sampler(())(logits.clone(), [seq(SamplingParams(temperature=0, logprobs=2), [0])])
    lp = out.logprobs[0]
    ref = torch.log_softmax(logits[0], -1)
    assert lp is not None and lp.token_id == 1 and lp.rank == 1
    assert abs(lp.logprob - float(ref[1])) < 1e-6
    assert [t for t, _ in lp.top] == [1, 2]


def test_a_draw_never_lands_on_a_token_without_mass(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """At the top of [0, 1) the cumulative sum's rounding could step past the last token
    with mass onto a filtered one (their cdf is flat); at 0 the first token with mass."""
    import pdmesh.engine.sampler as sampler

    probs = torch.tensor([[0.0, 0.25, 0.75, 0.0, 0.0]])
    for u in (1.0 - 2.0**-53, 0.0):
        monkeypatch.setattr(sampler, "uniforms", lambda gens, dev, u=u: torch.full((len(gens), 1), u,
                                                                                      dtype=torch.float64))
        assert sampler.draw(probs, [None]).tolist() == [2 if u else 1]


def test_seeded_uniform_advances_a_generator_as_a_draw_does() -> None:
    """What a resumed request relies on: skipping a token it did not sample leaves its
    generator where sampling it would have."""
    from pdmesh.engine.sampler import draw, seeded_uniform

    drawn, skipped = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    draw(torch.ones(1, 100), [drawn])
    seeded_uniform(skipped, "cpu")
    assert torch.equal(torch.rand(4, generator=drawn), torch.rand(4, generator=skipped))


def test_top_k_rows_draw_only_kept_tokens() -> None:
    logits = torch.randn(1, 64)
    s = seq(SamplingParams(temperature=1.5, top_k=3, seed=2), [0])
    kept = set(logits[0].topk(3).indices.tolist())
    drawn = {Sampler(())(logits.clone(), [s]).token_ids[0] for _ in range(300)}
    assert drawn <= kept and len(drawn) == 3


def _sorted_reference(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The masks by the definition, over each whole sorted row: top-k, then top-p and
    min-p on the probabilities after top-k."""
    vocab = logits.shape[-1]
    out = torch.zeros_like(logits, dtype=torch.bool)
    for r, p in enumerate(params):
        vals, order = logits[r].sort(descending=True)
        vals = vals.clone()
        if p.top_k:
            vals[p.top_k:] = float("-inf")
        probs = torch.softmax(vals, dim=-1)
        keep = torch.isfinite(vals)
        if p.top_p < 1.0:
            keep &= (probs.cumsum(-1) - probs) < p.top_p
        if p.min_p > 0:
            keep &= probs >= p.min_p * probs[0]
        out[r, order] = keep
    assert out.shape[-1] == vocab
    return out


def test_head_filter_keeps_what_sorting_the_whole_row_keeps(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``filter_logits`` looks at each row's best ``HEADS[0]`` tokens, then the next head's;
    rows whose top-p cut lies beyond them all (flat ones) are sorted whole. Whichever way,
    the kept tokens are the definition's, with every option alone and combined; the
    scales are chosen so that each way is taken (checked)."""
    import pdmesh.engine.nucleus as nucleus

    taken: set[object] = set()
    head_keep, whole = nucleus._head_keep, nucleus.filter_logits_sorted
    monkeypatch.setattr(nucleus, "_head_keep", lambda lg, ps, heads=nucleus.HEADS:
                        taken.add(heads[0]) or head_keep(lg, ps, heads))
    monkeypatch.setattr(nucleus, "filter_logits_sorted", lambda lg, ps: taken.add("sorted") or whole(lg, ps))
    gen = torch.Generator().manual_seed(0)
    vocab = 2 * nucleus.HEADS[-1]
    options = [SamplingParams(top_k=40), SamplingParams(top_p=0.9), SamplingParams(min_p=0.05),
               SamplingParams(top_k=600, top_p=0.95), SamplingParams(top_p=0.8, min_p=0.02),
               SamplingParams(top_k=10, top_p=0.5, min_p=0.1), SamplingParams(temperature=0.7)]
    for scale in (6.0, 4.0, 2.0, 0.05):  # top-p's cut in the first head, the second, the third, past all
        logits = torch.randn(len(options) * 2, vocab, generator=gen) * scale
        params = options * 2
        kept = torch.isfinite(filter_logits(logits.clone(), params))
        assert torch.equal(kept, _sorted_reference(logits, params)), scale
    assert taken == {*nucleus.HEADS, "sorted"}


def test_penalties_over_a_batch_equal_each_row_alone_as_tokens_are_appended() -> None:
    """Rows of different lengths, ids past the logits' vocabulary, and a sequence whose
    cached token tensor grows by one token a step: the batch's penalised logits are each
    row's alone, step after step."""
    gen = torch.Generator().manual_seed(4)
    vocab = 40
    params = [SamplingParams(repetition_penalty=1.3), SamplingParams(presence_penalty=0.5, frequency_penalty=0.2),
              SamplingParams(temperature=0), SamplingParams(repetition_penalty=0.8, frequency_penalty=1.0)]
    rows = [seq(p, torch.randint(0, vocab + 5, (3 + 4 * i,), generator=gen).tolist()) for i, p in enumerate(params)]
    for _ in range(3):
        logits = torch.randn(len(rows), vocab, generator=gen)
        batch = logits.clone()
        Sampler(())._apply_penalties(batch, rows)
        for r, row in enumerate(rows):
            alone = logits[r:r + 1].clone()
            fresh = seq(row.params, row.token_ids[:row.prompt_len], row.token_ids[row.prompt_len:])
            Sampler(())._apply_penalties(alone, [fresh])
            assert torch.equal(batch[r], alone[0]), r
        for row in rows:
            row.token_ids.append(int(torch.randint(0, vocab, (1,), generator=gen)))
