"""The accelerator's eager top-p route: HF's own sort, with the fast path's rule for exact ties."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import TopPLogitsWarper

from hfbridge._step.fast.top_p.device_sort import sorted_top_p_keep


@st.composite
def cases(draw):
    rows, vocab = draw(st.integers(1, 4)), draw(st.integers(1, 60))
    values = draw(st.lists(st.floats(-20, 20, width=32), min_size=rows * vocab, max_size=rows * vocab))
    scores = torch.tensor(values, dtype=torch.float32).view(rows, vocab)
    if draw(st.booleans()):
        scores = scores.round()  # ties
    if draw(st.booleans()):
        scores[0, draw(st.integers(0, vocab - 1))] = float("-inf")
    return scores, draw(st.floats(0.0, 1.0)), draw(st.integers(1, 4))


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_the_same_mass_as_hf_and_hf_exactly_without_ties(case):
    scores, top_p, at_least = case
    expected = TopPLogitsWarper(top_p, min_tokens_to_keep=at_least)(None, scores.clone()) > float("-inf")
    got = sorted_top_p_keep(scores, top_p, at_least) & (scores > float("-inf"))
    assert torch.equal(got.sum(-1), expected.sum(-1))  # the same number kept: HF's cut
    distinct = all(len(set(row)) == len(row) for row in scores.tolist())
    if distinct:
        assert torch.equal(got, expected)
    else:  # within a tie group split by the cut the lowest ids stay; the same scores either way
        assert torch.equal(torch.sort(scores.masked_fill(~got, -1e9), -1).values,
                           torch.sort(scores.masked_fill(~expected, -1e9), -1).values)


def test_ties_at_the_cut_keep_the_lowest_ids():
    assert sorted_top_p_keep(torch.zeros(1, 4), 0.5, 1).tolist() == [[True, True, False, False]]
    chunked = torch.zeros(3, 8)
    assert torch.equal(sorted_top_p_keep(chunked, 0.5, 1), torch.tensor([[True] * 4 + [False] * 4] * 3))
