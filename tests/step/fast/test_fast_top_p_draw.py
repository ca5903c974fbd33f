"""Top-p with many survivors: the draw checks its token (rejection) instead of finding the cut."""

import math

import pytest
import torch
from _zipf import zipf
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge import Sampler, sample_step
from hfbridge._step.fast.candidates import certified_total, top_p_candidates
from hfbridge._step.fast.fast_path import fast_draw, fast_sample, fast_scores
from hfbridge._step.fast.top_p import draw_then_check as _top_p_draw
from hfbridge._step.fast.top_p.draw_then_check import TopPDraw, draw_top_p, kept_exactly, top_p_route
from hfbridge._step.fast.top_p.mask import float32, rounds_at_most, top_p_mask

NEG_INF = float("-inf")


def rows_of_every_kind(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randn(2, vocab, generator=g)
    from_bf16 = (torch.randn(2, vocab, generator=g) * 2).bfloat16().float()  # many equal scores
    near_equal = (torch.randperm(vocab, generator=g).double() * (1e-8 / vocab)).float()[None]  # equal probabilities
    return torch.cat([flat, zipf(2, vocab, seed), from_bf16, near_equal])


def chi2_bound(df):
    """The 0.9995 quantile of the chi-square distribution (Wilson-Hilferty)."""
    z = 3.29
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95])
@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.6])
def test_each_tokens_check_is_the_cut_over_the_row(top_p, temperature):
    # Every token of every row: kept by the check exactly when the radix select over the whole row
    # keeps it (HF's set, with the lowest ids kept among equal scores split by the cut).
    x = rows_of_every_kind(3000, seed=int(100 * temperature))
    scores = x / temperature
    probs = torch.softmax(scores, dim=-1)
    keep = top_p_mask(probs, top_p, scores=scores)
    cut, inclusive = rounds_at_most(float32(1.0 - top_p))
    for row in range(scores.shape[0]):
        row_scores, row_probs = scores[row].numpy(), probs[row].numpy()
        checked = torch.tensor([kept_exactly(row_scores, row_probs, t, cut, inclusive)
                                for t in range(scores.shape[1])])
        assert torch.equal(checked, keep[row]), row
        distinct = x[row].unique().numel() == x.shape[1]
        if distinct:  # where scores differ, that is HF's own set
            ref = hf.TopPLogitsWarper(top_p)(None, scores[row : row + 1].clone())[0] > NEG_INF
            assert torch.equal(checked, ref)


@pytest.mark.parametrize("vocab", [640, 600], ids=["sums-of-16", "sums-of-16-and-the-rest"])
@pytest.mark.parametrize("skip", [True, False], ids=["candidates-skipped", "candidates-tried"])
def test_draws_follow_hfs_distribution_when_many_tokens_survive(vocab, skip, monkeypatch):
    if not skip:  # the draw then accepts the candidates that surely survive without a check
        monkeypatch.setattr(_top_p_draw, "candidates_cannot_hold", lambda *args: False)
    x = torch.randn(1, vocab, generator=torch.Generator().manual_seed(vocab)) * 0.7
    processors = [hf.TemperatureLogitsWarper(0.9), hf.TopPLogitsWarper(0.9)]
    scores = x / 0.9
    tried = top_p_candidates(scores, torch.softmax(scores, dim=-1), 0.9, 1)
    assert tried is not None and not tried.proved  # hundreds survive: the draw checks its tokens
    expected = torch.softmax(LogitsProcessorList(processors)(None, x.clone()), dim=-1)[0]
    n = 60_000
    tokens = fast_sample(None, x.expand(n, -1).clone(), processors, torch.Generator().manual_seed(2))
    counts = torch.bincount(tokens, minlength=vocab).double()
    support = expected > 0
    assert counts[~support].sum() == 0, "drew a token HF's top-p removed"
    e = expected[support].double() * n
    stat, df = float(((counts[support] - e) ** 2 / e).sum()), int(support.sum()) - 1
    assert df > 300
    assert stat < chi2_bound(df), f"chi-square {stat:.1f} with {df} degrees of freedom"


@pytest.mark.parametrize("vocab", [32000, 50257])
@pytest.mark.parametrize("temperature", [0.8, 1.0, 1.3])
def test_large_vocabularies_draw_only_what_hf_keeps(vocab, temperature):
    x = rows_of_every_kind(vocab, seed=vocab)
    processors = LogitsProcessorList([hf.TemperatureLogitsWarper(temperature), hf.TopPLogitsWarper(0.9)])
    kept = fast_scores(None, x.clone(), processors) > NEG_INF  # HF's set (see test_fast_ties)
    rows = x.repeat(8, 1)
    for seed in range(3):
        tokens = fast_sample(None, rows.clone(), processors, torch.Generator().manual_seed(seed))
        assert bool(kept.repeat(8, 1).gather(1, tokens[:, None]).all())
    first = fast_sample(None, rows.clone(), processors, torch.Generator().manual_seed(5))
    assert torch.equal(first, fast_sample(None, rows.clone(), processors, torch.Generator().manual_seed(5)))


def test_rows_without_a_distribution_keep_exact_modes_errors():
    x = torch.randn(4, 5000, generator=torch.Generator().manual_seed(0))
    for row, value in ((1, float("nan")), (2, float("inf"))):
        bad = x.clone()
        bad[row, 7] = value
        out = fast_draw(None, bad.clone(), [hf.TemperatureLogitsWarper(1.0), hf.TopPLogitsWarper(0.9)])
        assert out.valid.tolist() == [r != row for r in range(4)]
        with pytest.raises(ValueError) as exact:
            sample_step(bad, top_p=0.9, top_k=0, temperature=0.9)
        with pytest.raises(ValueError) as fast:
            sample_step(bad, top_p=0.9, top_k=0, temperature=0.9, fast=True)
        assert str(fast.value) == str(exact.value)


def test_min_tokens_to_keep_past_the_sure_candidates_finds_the_cut():
    x = torch.randn(2, 5000, generator=torch.Generator().manual_seed(1))
    probs = torch.softmax(x, dim=-1)
    tried = top_p_candidates(x, probs, 0.9, 1)
    assert tried is not None and not tried.proved
    assert draw_top_p(x, probs, tried, 0.9, 64) is None  # more than the candidates surely kept
    processors = LogitsProcessorList([hf.TopPLogitsWarper(0.9, min_tokens_to_keep=60)])
    kept = processors(None, x.clone()) > NEG_INF
    tokens = fast_sample(None, x.repeat(50, 1), processors, torch.Generator().manual_seed(0))
    assert bool(kept.repeat(50, 1).gather(1, tokens[:, None]).all())


@pytest.mark.parametrize("options", [
    dict(temperature=0.7, top_p=0.9, top_k=0), dict(temperature=1.0, top_p=0.9, top_k=0),
    dict(temperature=1.3, top_p=0.95, top_k=0), dict(temperature=0.8, top_k=20),
    dict(temperature=0.8, min_p=0.05, top_k=0), dict(repetition_penalty=1.3, temperature=0.9, top_p=0.9, top_k=0),
    dict(top_p=0.9, top_k=0), dict(top_k=0, temperature=0.6),
], ids=lambda o: "+".join(o))
def test_sampler_lends_float32_logits_read_only(options):
    # The fast path reads float32 rows in place and copies only where it writes; the caller's
    # logits are untouched and the tokens are those of a private copy.
    x = zipf(3, 20000, seed=3)
    x[1] = torch.randn(20000, generator=torch.Generator().manual_seed(4))
    logits = x[:, None, :].expand(3, 2, 20000).contiguous()  # (batch, time, vocab): the last step is a view
    before = logits.clone()
    ids = torch.randint(0, 20000, (3, 6), generator=torch.Generator().manual_seed(5))
    lent = Sampler(do_sample=True, fast=True, generator=torch.Generator().manual_seed(6), **options)(logits, ids)
    assert torch.equal(logits, before)
    copied = Sampler(do_sample=True, fast=True, generator=torch.Generator().manual_seed(6), **options)
    assert torch.equal(lent, copied(logits.double(), ids))  # float64 rows go through a float32 copy


def test_the_draw_skips_candidates_that_cannot_hold_the_cut():
    # Flat rows and Zipf-like rows at temperature 1 keep thousands of tokens: the candidates are
    # not tried; at temperature 0.7 the best 64 hold the cut. With a memo, the bound is tried
    # only after a step whose candidates failed.
    flat = torch.randn(4, 128256, generator=torch.Generator().manual_seed(7))
    for rows, temperature, skipped in ((zipf(4, 128256, seed=7), 1.0, True), (flat, 0.8, True),
                                       (zipf(4, 128256, seed=7), 0.7, False)):
        scores = rows / temperature
        probs = torch.softmax(scores, dim=-1)
        route = top_p_route(scores, probs, 0.9, 1)
        assert isinstance(route, TopPDraw) == skipped
        assert not skipped or route.tried is None
        memo = {}
        top_p_route(scores, probs, 0.9, 1, memo)
        if not skipped:
            assert top_p_route(scores, probs, 0.9, 1, memo).proved and memo["kept"] <= 64
    scores = zipf(4, 128256, seed=7)
    route = top_p_route(scores, torch.softmax(scores, dim=-1), 0.9, 2)  # min_tokens_to_keep: candidates tried
    assert isinstance(route, TopPDraw) and route.tried is not None


@pytest.mark.parametrize("temperature", [0.8, 1.0])
def test_skipping_the_candidates_changes_no_token(temperature, monkeypatch):
    # The draw does not depend on the candidates: skipped or tried, the same seed gives the same tokens.
    x = torch.cat([zipf(6, 50000, seed=11), torch.randn(2, 50000, generator=torch.Generator().manual_seed(12))])
    processors = [hf.TemperatureLogitsWarper(temperature), hf.TopPLogitsWarper(0.9)]
    skipped = [fast_sample(None, x.clone(), processors, torch.Generator().manual_seed(s)) for s in range(4)]
    monkeypatch.setattr(_top_p_draw, "candidates_cannot_hold", lambda *args: False)
    tried = [fast_sample(None, x.clone(), processors, torch.Generator().manual_seed(s)) for s in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(skipped, tried))


def test_the_draw_needs_a_distribution_in_every_row():
    x = torch.randn(3, 5000, generator=torch.Generator().manual_seed(2))
    for value in (float("nan"), float("inf")):
        bad = x.clone()
        bad[1, 9] = value
        probs = torch.softmax(bad, dim=-1)
        assert draw_top_p(bad, probs, None, 0.9, 1) is None
        assert not isinstance(top_p_route(bad, probs, 0.9, 1), TopPDraw)
    only_inf = x.clone()
    only_inf[2] = NEG_INF
    assert draw_top_p(only_inf, torch.softmax(only_inf, dim=-1), None, 0.9, 1) is None
    probs = torch.softmax(x, dim=-1)
    assert draw_top_p(x, probs, None, 0.4, 1, total=certified_total(probs)) is None  # top_p < 0.5: find the cut


def test_the_check_answers_a_python_bool():
    # torch 2.6 cannot build a bool tensor from NumPy bools (the draw collects the answers in a list);
    # NumPy's count of equal scores can be an np.int64, which once turned the answer into np.bool_.
    x = rows_of_every_kind(3000, seed=70)
    scores = x / 0.7
    probs = torch.softmax(scores, dim=-1)
    cut, inclusive = rounds_at_most(float32(0.5))
    answers = {type(kept_exactly(scores[6].numpy(), probs[6].numpy(), t, cut, inclusive)) for t in range(3000)}
    assert answers == {bool}
