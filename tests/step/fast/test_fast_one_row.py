"""The one-row route of the fast path (`_one_row.py`, `draw_one_row`): HF's surviving set, the batched
route's tokens, its fallbacks, exact mode's errors, the caller's tensors untouched."""

import doctest

import pytest
import torch
from _zipf import zipf
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fast import CHI2_999, assert_same_filter, chi_square
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge import Sampler, sample_step
from hfbridge._step.fast import one_row as _one_row
from hfbridge._step.fast import weighted_draw as _draw
from hfbridge._step.fast.fast_path import fast_draw, fast_sample, fast_scores
from hfbridge._step.fast.weighted_draw import draw_one_row, pick

NEG_INF, NAN, INF = float("-inf"), float("nan"), float("inf")


def kept(scores):
    return (scores > NEG_INF).nonzero()[:, 1].tolist()


def chains(temperature, top_p):
    """The B=1 chains of `benchmarks/step.py --targets`, at one temperature and top_p."""
    warm = [hf.TemperatureLogitsWarper(temperature)]
    return {
        "top-p": warm + [hf.TopPLogitsWarper(top_p)],
        "top-p keep 3": warm + [hf.TopPLogitsWarper(top_p, min_tokens_to_keep=3)],
        "top-k": warm + [hf.TopKLogitsWarper(50)],
        "top-k+top-p": [hf.RepetitionPenaltyLogitsProcessor(1.2)] + warm + [hf.TopKLogitsWarper(50),
                                                                             hf.TopPLogitsWarper(top_p)],
        "min-p": warm + [hf.MinPLogitsWarper(0.05)],
    }


@pytest.mark.parametrize("temperature", [0.3, 0.7, 0.8, 1.0, 1.5])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95])
def test_one_row_equals_hf(temperature, top_p):
    ids = torch.randint(0, 32000, (1, 20), generator=torch.Generator().manual_seed(0))
    for x in (zipf(1, 32000, seed=3), zipf(1, 32000, seed=4, exponent=1.6),
              torch.randn(1, 32000, generator=torch.Generator().manual_seed(5)) * 3):
        for processors in chains(temperature, top_p).values():
            processors = LogitsProcessorList(processors)
            assert_same_filter(processors(ids, x.clone()), fast_scores(ids, x.clone(), processors))


def test_one_row_equals_the_batched_route_over_successive_steps():
    # One memo across steps whose cut moves by many binades up and down: the guess from the last
    # step fails, then the histogram runs; every step keeps what the same row keeps in a batch.
    memo, g = {}, torch.Generator().manual_seed(7)
    rows = [zipf(1, 5000, seed=s, exponent=e) for s, e in enumerate([1.1, 3.0, 0.6, 1.4, 1.4, 5.0, 0.9])]
    rows += [torch.randn(1, 5000, generator=g) * s for s in (0.5, 8.0, 30.0)]
    rows += [torch.randint(0, 4, (1, 5000), generator=g).float()]  # ties everywhere, also at the cut
    for x in rows * 2:
        for temperature, top_p in ((0.8, 0.9), (1.0, 0.5), (0.6, 0.99)):
            processors = LogitsProcessorList([hf.TemperatureLogitsWarper(temperature), hf.TopPLogitsWarper(top_p)])
            one = fast_draw(None, x.clone(), processors, memo=memo).final_scores()
            both = fast_scores(None, torch.cat([x, x]), processors)  # two rows: the batched candidate route
            assert torch.equal(one[0], both[0])
            assert_same_filter(processors(None, x.clone()), one)


def test_same_token_as_the_row_in_a_batch():
    # The same weights, the same uniform number, the same float64 running sum as `pick`.
    x = zipf(1, 32000, seed=9)
    processors = [hf.TemperatureLogitsWarper(0.8), hf.TopPLogitsWarper(0.9)]
    for seed in range(20):
        alone = fast_sample(None, x.clone(), processors, torch.Generator().manual_seed(seed))
        batched = fast_sample(None, torch.cat([x, x]), processors, torch.Generator().manual_seed(seed))
        assert alone.tolist() == batched[:1].tolist()
    ids = torch.tensor([[4, 9, 1, 7, 3]])
    cand = torch.tensor([[3.0, 2.5, 2.5, 0.0, -1.0]])
    keep = torch.tensor([[True, True, True, True, False]])
    for seed in range(50):
        token, valid = draw_one_row(ids, cand, keep, torch.Generator().manual_seed(seed))
        weights = (cand - cand[:, :1]).exp().masked_fill(~keep, 0.0)
        index, _ = pick(weights, torch.Generator().manual_seed(seed))
        assert token.tolist() == ids[0, index].tolist() and valid.tolist() == [True]
    for bad in ([[NAN, 1.0]], [[INF, 1.0]], [[NEG_INF, NEG_INF]], [[0.0, NAN]]):  # no distribution
        cand, ids, keep = torch.tensor(bad), torch.tensor([[5, 6]]), torch.tensor([[True, True]])
        token, valid = draw_one_row(ids, cand, keep, torch.Generator().manual_seed(0))
        index, flag = pick((cand - cand[:, :1]).exp(), torch.Generator().manual_seed(0))
        assert token.tolist() == ids[0, index].tolist() and valid.tolist() == flag.tolist() == [False]


def test_draw_one_row_follows_the_distribution():
    ids = torch.arange(10, 17)[None]
    cand = torch.tensor([[2.0, 1.5, 1.5, 1.0, 0.3, -0.5, -3.0]])
    keep = torch.tensor([[True, True, True, True, True, True, False]])
    g = torch.Generator().manual_seed(11)
    tokens = torch.cat([draw_one_row(ids, cand, keep, g)[0] for _ in range(20_000)]) - 10
    expected = torch.softmax(cand.masked_fill(~keep, NEG_INF), dim=-1)[0]
    stat, df = chi_square(tokens, expected)
    assert stat < CHI2_999[df]


def test_sampler_steps_follow_hfs_distribution():
    # A whole Sampler step at B=1 (the route the benchmark's B=1 target measures), many steps.
    x = torch.tensor([[2.0, 1.5, 1.5, 1.0, 0.3, -0.5, -1.0, -3.0, 0.9, 1.2, NEG_INF, 0.1]])
    sampler = Sampler(temperature=0.8, top_p=0.9, top_k=0, fast=True, generator=torch.Generator().manual_seed(2))
    processors = LogitsProcessorList([hf.TemperatureLogitsWarper(0.8), hf.TopPLogitsWarper(0.9)])
    expected = torch.softmax(processors(None, x.clone()), dim=-1)[0]
    tokens = torch.cat([sampler(x) for _ in range(8000)])
    stat, df = chi_square(tokens, expected)
    assert stat < CHI2_999[df]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_flat_rows_come_back_as_the_radix_selects_mask(temperature):
    # More kept tokens than are worth sorting: 256 buckets of the cut's binade, a mask back.
    g = torch.Generator().manual_seed(int(temperature * 10))
    processors = LogitsProcessorList([hf.TemperatureLogitsWarper(temperature), hf.TopPLogitsWarper(0.9)])
    for x in (torch.randn(1, 32000, generator=g), zipf(1, 50257, seed=5, exponent=0.9 * temperature),
              torch.rand(1, 40000, generator=g)):
        scores = x / temperature
        found = _one_row.one_row_top_p(scores, torch.softmax(scores, dim=-1), 0.9, 1, {})
        assert isinstance(found, torch.Tensor) and found.shape == x.shape and int(found.sum()) > _one_row.MAX_SORTED
        one = fast_draw(None, x.clone(), processors, memo={}).final_scores()
        assert torch.equal(one, fast_scores(None, x.clone(), processors, candidates=False))  # the radix select
        assert_same_filter(processors(None, x.clone()), one)


def test_declined_rows_go_to_the_general_routes():
    # Distinct scores whose float32 probabilities all tie: one bucket holds the whole row.
    x = (torch.arange(20000).double() * 1e-12).float()[None]
    probs = torch.softmax(x, dim=-1)
    assert _one_row.one_row_top_p(x, probs, 0.5, 1, {}) is None
    assert kept(fast_scores(None, x.clone(), [hf.TopPLogitsWarper(0.5)])) == list(range(10000, 20000))
    # min_tokens_to_keep beyond what a flat row keeps is left to them too.
    y = torch.randn(1, 20000, generator=torch.Generator().manual_seed(3))
    assert _one_row.one_row_top_p(y, torch.softmax(y, dim=-1), 1e-9, 6000, {}) is None
    processors = LogitsProcessorList([hf.TopPLogitsWarper(1e-9, min_tokens_to_keep=6000)])
    assert_same_filter(processors(None, y.clone()), fast_scores(None, y.clone(), processors))
    # A row without a distribution: declined, then flagged by the general route.
    nan_row = torch.zeros(1, 100)
    nan_row[0, 3] = NAN
    assert _one_row.one_row_top_p(nan_row, torch.softmax(nan_row, dim=-1), 0.9, 1, {"one_row_bound": None}) is None


def test_min_tokens_to_keep_beyond_the_candidates():
    x = torch.full((1, 3000), -50.0)
    x[0, 7] = 10.0  # one token holds all the mass; HF still keeps the best 5
    x[0, 100:104] = torch.tensor([-1.0, -2.0, -3.0, -4.0])
    processors = LogitsProcessorList([hf.TopPLogitsWarper(0.5, min_tokens_to_keep=5)])
    out = fast_scores(None, x.clone(), processors)
    assert kept(out) == [7, 100, 101, 102, 103]
    assert torch.equal(out, processors(None, x.clone()))


@pytest.mark.parametrize("options", [
    dict(temperature=0.8, top_p=0.9, top_k=0),
    dict(temperature=0.8, top_k=50),
    dict(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.2),
    dict(processors=[hf.TopPLogitsWarper(0.9, min_tokens_to_keep=2)], top_k=0),
], ids=["top-p", "top-k", "rep+top-k+top-p", "top-p keep 2"])
@pytest.mark.parametrize("fault", ["nan", "+inf", "all -inf"])
def test_invalid_rows_raise_exact_modes_error(options, fault):
    x = zipf(1, 2000, seed=1)
    if fault == "nan":
        x[0, 17] = NAN
    elif fault == "+inf":
        x[0, 17] = INF
    else:
        x[0] = NEG_INF
    ids = torch.zeros(1, 2, dtype=torch.long)
    errors = []
    for fast in (False, True):
        with pytest.raises(ValueError) as info:
            sample_step(x, ids, do_sample=True, fast=fast, **options)
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert "row 0" in errors[1]


def test_callers_tensors_untouched_and_grad_logits():
    g = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        logits = zipf(1, 32000, seed=2).to(dtype)[:, None, :].expand(1, 3, 32000).clone()  # [B, T, V]
        ids = torch.randint(0, 32000, (1, 5), generator=g)
        before = logits.clone(), ids.clone()
        sampler = Sampler(temperature=0.8, top_p=0.9, top_k=0, repetition_penalty=1.1, fast=True)
        for _ in range(3):
            token = sampler(logits, ids)
            assert token.shape == (1,) and 0 <= int(token) < 32000
        assert torch.equal(logits, before[0]) and torch.equal(ids, before[1])
    weights = torch.randn(1, 500, requires_grad=True)  # a model called without no_grad
    for options in (dict(top_p=0.9, top_k=0), dict(top_k=5), dict(top_k=5, top_p=0.8)):
        assert sample_step(weights * 3, fast=True, **options).shape == (1,)


def test_docstring_examples():
    for module in (_one_row, _draw):
        failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert tried >= 3 and failures == 0


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(st.floats(-30, 30, width=32), st.sampled_from([NEG_INF, 0.0, 1.0])),
                       min_size=1, max_size=60),
       top_p=st.one_of(st.floats(1e-6, 1.0), st.sampled_from([0.5, 0.9, 0.95, 1.0])), at_least=st.integers(1, 5))
def test_one_row_count_equals_the_batched_count(values, top_p, at_least):
    """After a top-k, one CPU row's top-p count on NumPy is the batched route's count, bit for bit."""
    from hfbridge._step.fast.candidates import top_p_count

    cand = torch.tensor(sorted(values, reverse=True), dtype=torch.float32)[None]  # [1, K], descending
    probs = torch.softmax(cand, dim=-1)
    batched = top_p_count(probs, torch.zeros(1, 1, dtype=torch.float64), top_p, at_least)
    assert _one_row.one_row_count(probs[0].tolist(), top_p, at_least) == int(batched)


def test_one_row_count_after_top_k_keeps_hfs_set():
    x = zipf(1, 32000, seed=11)
    for top_k, top_p in ((40, 0.95), (40, 0.5), (3, 0.99), (200, 0.9)):
        processors = LogitsProcessorList([hf.TemperatureLogitsWarper(0.8), hf.TopKLogitsWarper(top_k),
                                          hf.TopPLogitsWarper(top_p), hf.MinPLogitsWarper(0.05)])
        assert_same_filter(processors(None, x.clone()), fast_scores(None, x.clone(), processors))
