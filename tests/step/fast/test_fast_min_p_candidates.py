"""Min-p after top-k decided on the candidates: HF's surviving set and scores, and the fallback near the threshold."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fast_ties import adversarial_rows, assert_hfs_set
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge import Sampler
from hfbridge._step.fast.fast_path import fast_scores
from hfbridge._step.fast.min_p_candidates import min_p_among
from hfbridge._step.fast.pending import Candidates

NEG_INF = float("-inf")
NAN = float("nan")


def chain(temperature, top_k, top_p, min_p):
    return ([hf.TemperatureLogitsWarper(temperature)] if temperature else []) + [hf.TopKLogitsWarper(top_k)] + \
        ([hf.TopPLogitsWarper(top_p)] if top_p else []) + [hf.MinPLogitsWarper(min_p)]


@st.composite
def special_rows(draw):
    """Rows with NaN, +-inf, exact ties, or few finite scores, at tiny vocabularies."""
    x = draw(adversarial_rows())
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    for value in draw(st.lists(st.sampled_from([NAN, float("inf"), NEG_INF, "tie"]), max_size=3)):
        row = int(torch.randint(0, x.shape[0], (), generator=g))
        at = torch.randint(0, x.shape[1], (max(1, x.shape[1] // 3),), generator=g)
        x[row, at] = x[row].max() if value == "tie" else value
    return x


@settings(max_examples=200, deadline=None)
@given(x=special_rows(), min_p=st.floats(0.0, 1.0), top_k=st.integers(1, 50),
       top_p=st.sampled_from([None, 0.3, 0.9, 0.95]), temperature=st.sampled_from([None, 0.05, 0.8, 3.0]))
def test_min_p_on_candidates_is_hfs_min_p_after_the_same_filters(x, min_p, top_k, top_p, temperature):
    # HF's own MinPLogitsWarper applied to the fast path's output before it: the same scores, bit for bit
    before = fast_scores(None, x.clone(), LogitsProcessorList(chain(temperature, top_k, top_p, min_p)[:-1]))
    expected = hf.MinPLogitsWarper(min_p)(None, before.clone())
    got = fast_scores(None, x.clone(), LogitsProcessorList(chain(temperature, top_k, top_p, min_p)))
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(0.0), expected.nan_to_num(0.0))


@settings(max_examples=100, deadline=None)
@given(x=adversarial_rows(), min_p=st.floats(0.0, 1.0), top_k=st.integers(1, 50),
       temperature=st.sampled_from([None, 0.7, 2.0]))
def test_min_p_after_top_k_keeps_hfs_set(x, min_p, top_k, temperature):
    processors = LogitsProcessorList(chain(temperature, top_k, None, min_p))
    assert_hfs_set(x, processors(None, x.clone()), fast_scores(None, x.clone(), processors))


def test_a_ratio_within_rounding_of_min_p_goes_through_hfs_arithmetic():
    # exp(score - best) == min_p to float rounding: the candidates do not decide, HF's softmax does
    for min_p in (0.1, 0.05, 1 / 3, 0.5):
        x = torch.full((1, 300), -50.0)
        x[0, 0], x[0, 7], x[0, 9] = 2.0, 2.0 + math.log(min_p), 2.0 + math.log(min_p) * (1 + 1e-7)
        cand, ids = torch.topk(x, 3)
        assert min_p_among(Candidates(ids, cand, torch.ones_like(ids, dtype=torch.bool)), min_p) is None
        processors = LogitsProcessorList([hf.TopKLogitsWarper(3), hf.MinPLogitsWarper(min_p)])
        assert torch.equal(fast_scores(None, x.clone(), processors), processors(None, x.clone()))


def test_far_decisions_and_removed_candidates():
    ids = torch.tensor([[5, 2, 9, 1], [0, 3, 4, 8]])
    cand = torch.tensor([[3.0, 2.0, 0.0, -9.0], [1.0, 1.0, 0.9, 0.0]])
    keep = torch.tensor([[True, True, True, True], [True, True, True, False]])  # a top-p already removed one
    out = min_p_among(Candidates(ids, cand, keep, all_kept=False), 0.2)
    # row 0: e^-1 = 0.37 kept, e^-3 = 0.05 and e^-12 removed; row 1: e^-0.1 kept, the removed one stays removed
    assert out.keep.tolist() == [[True, True, False, False], [True, True, True, False]]
    assert torch.equal(out.ids, ids) and torch.equal(out.cand, cand)
    for bad in (NAN, float("inf")):  # no distribution: HF's arithmetic on the whole row decides
        assert min_p_among(Candidates(ids, cand.clone().index_fill_(1, torch.tensor([1]), bad), keep), 0.2) is None
    assert min_p_among(Candidates(ids, torch.tensor([[0.0, -800.0, -900.0, -1000.0]] * 2), keep), 0.0) is None


def test_fast_sampler_draws_only_hfs_survivors():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5000, generator=g) * 3
    ids = torch.randint(0, 5000, (4, 30), generator=g)
    options = dict(do_sample=True, repetition_penalty=1.1, top_k=40, top_p=0.95, min_p=0.05, temperature=0.8)
    survivors = Sampler(**options).process(ids, logits.clone()) > NEG_INF  # [4, V], exact mode: HF's chain
    sampler = Sampler(fast=True, generator=torch.Generator().manual_seed(1), **options)
    for _ in range(200):
        tokens = sampler(logits, ids)
        assert bool(survivors.gather(1, tokens[:, None]).all())
    counts = torch.zeros(5000)
    row = torch.Generator().manual_seed(2)
    one = Sampler(fast=True, generator=row, **options)
    for _ in range(4000):
        counts[int(one(logits[:1], ids[:1]))] += 1
    expected = torch.softmax(Sampler(**options).process(ids[:1], logits[:1].clone())[0], dim=-1)
    assert float((counts / 4000 - expected).abs().max()) < 0.03
