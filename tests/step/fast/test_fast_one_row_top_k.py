"""The one-row top-k on NumPy views: torch's top-k values, equal scores in id order, and where it declines."""

import pytest
import torch
from _zipf import zipf
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fast_ties import adversarial_rows
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge._step.fast.candidates import top_candidates
from hfbridge._step.fast.fast_path import fast_scores
from hfbridge._step.fast.one_row import MAX_SORTED, one_row_top_k

NEG_INF = float("-inf")


def assert_top_k(x, k):
    found = one_row_top_k(x, k)
    if found is None:  # declined only for rows where thousands of scores tie at the top
        assert int((x == x.max()).sum()) > MAX_SORTED // 4
        return
    values, ids = (torch.from_numpy(array)[None] for array in found)  # [1, k] each
    assert torch.equal(values, torch.topk(x, k).values)
    assert torch.equal(x.gather(1, ids), values)
    assert len(set(ids[0].tolist())) == k
    ties = values[:, 1:] == values[:, :-1]
    assert bool((ids[:, 1:] > ids[:, :-1])[ties].all())  # equal scores in id order, as top_candidates
    expected_values, expected_ids = top_candidates(x, k)
    if not bool((expected_values[0, -1] == x[0]).sum() > (expected_values[0] == expected_values[0, -1]).sum()):
        assert torch.equal(ids, expected_ids)  # the same tokens unless a tie straddles the k-th place


@pytest.mark.parametrize(("vocab", "k"), [(32000, 41), (50257, 41), (128256, 65), (64 * 41, 41), (4099, 33),
                                          (151936, 513), (8192, 1)])
def test_one_row_top_k_is_torch_topk(vocab, k):
    g = torch.Generator().manual_seed(vocab + k)
    rows = [torch.randn(1, vocab, generator=g), torch.randint(0, 30, (1, vocab), generator=g).float(),
            zipf(1, vocab, seed=k)]
    tail = torch.full((1, vocab), NEG_INF)
    tail[0, -(vocab % 64 or 64):] = torch.randn(vocab % 64 or 64, generator=g)  # the best past the last group
    tail[0, :k] = -1e30
    for x in rows + [tail]:
        assert_top_k(x, k)


@settings(max_examples=200, deadline=None)
@given(x=adversarial_rows(), k=st.integers(1, 12), inf=st.sampled_from([None, "inf", "-inf"]))
def test_one_row_top_k_on_adversarial_rows(x, k, inf):
    x = x[:1]
    if inf is not None:
        x[0, ::3] = float(inf)
    if x.shape[1] < 64 * k:
        assert one_row_top_k(x, k) is None  # fewer groups than k: declined
    else:
        assert_top_k(x, k)


def test_one_row_top_k_declines():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 32000, generator=g)
    nan = x.clone()
    nan[0, 17] = float("nan")  # torch's top-k ranks NaN first: the general route keeps that
    assert one_row_top_k(nan, 41) is None
    assert one_row_top_k(torch.randn(2, 32000, generator=g), 41) is None  # one row only
    assert one_row_top_k(torch.randn(32000, 2, generator=g).t()[:1], 41) is None  # not contiguous
    flat = torch.zeros(1, 32000)  # every score ties: more than MAX_SORTED above the bound
    assert MAX_SORTED < 32000 and one_row_top_k(flat, 41) is None


@settings(max_examples=100, deadline=None)
@given(x=adversarial_rows(), top_k=st.integers(1, 20), temperature=st.sampled_from([None, 0.3, 1.7]),
       vocab=st.sampled_from([1300, 4096]))
def test_top_k_of_one_row_keeps_hfs_set(x, top_k, temperature, vocab):
    x = x[:1].repeat(1, vocab // x.shape[1] + 1)[:, :vocab]  # repeated scores: ties everywhere
    x = x + torch.arange(vocab) * 1e-3 * float(x.abs().max().clamp(max=1e30))
    processors = LogitsProcessorList(([hf.TemperatureLogitsWarper(temperature)] if temperature else [])
                                     + [hf.TopKLogitsWarper(top_k)])
    expected = processors(None, x.clone())
    got = fast_scores(None, x.clone(), processors)
    assert int((expected > NEG_INF).sum()) == int((got > NEG_INF).sum())
    finite = x[torch.isfinite(x)]
    if finite.unique().numel() == finite.numel():
        assert torch.equal(expected, got)
