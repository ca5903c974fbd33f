"""The CPU top-p cut by a NumPy sort: HF's surviving set, and the radix select's, at every size."""

import doctest
import tracemalloc

import pytest
import torch
from transformers.generation import logits_process as hf

from hfbridge._step.fast.top_p import sorted_mask as _top_p_sorted
from hfbridge._step.fast.top_p.mask import float32, rounds_at_most, top_p_mask
from hfbridge._step.fast.top_p.sorted_mask import top_p_mask_sorted

NEG_INF = float("-inf")
TOP_P = [0.0, 1e-6, 0.3, 0.9, 0.999999, 1.0]


def hf_keep(scores: torch.Tensor, top_p: float, keep: int = 1) -> torch.Tensor:
    """The tokens HF's warper keeps (a NaN filter value tells a removed `-inf` from a kept one)."""
    out = hf.TopPLogitsWarper(top_p, filter_value=float("nan"), min_tokens_to_keep=keep)(None, scores.clone())
    return ~torch.isnan(out) | torch.isnan(scores)


def rows(batch: int, vocab: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("vocab", [1, 7, 1023, 1024, 1025, 3001])  # below, at and around one block
@pytest.mark.parametrize("keep", [1, 5])
def test_equals_hf_on_distinct_scores(vocab, keep):
    x = rows(3, vocab, seed=vocab, scale=3.0)
    probs = torch.softmax(x, dim=-1)
    for top_p in TOP_P:
        out = top_p_mask_sorted(probs, top_p, keep, scores=x)
        assert torch.equal(out, hf_keep(x, top_p, keep)), (vocab, top_p, keep)


@pytest.mark.parametrize("shape", [(40, 700), (3, 128256), (2, 300_000)])  # many rows a chunk; one; one > a chunk
def test_equals_the_radix_select_at_every_chunking(shape):
    for seed, scale in ((0, 1.0), (1, 0.01), (2, 8.0)):
        x = rows(*shape, seed=seed, scale=scale)
        probs = torch.softmax(x, dim=-1)
        for top_p in (0.1, 0.9, 0.999):
            for keep in (1, 3):
                expected = top_p_mask(probs, top_p, keep, scores=x)
                assert torch.equal(top_p_mask_sorted(probs, top_p, keep, scores=x), expected), (shape, seed, top_p)


def test_flat_rows_at_full_size_equal_hf():
    x = rows(2, 32000, seed=3) / 0.8
    probs = torch.softmax(x, dim=-1)
    assert torch.equal(top_p_mask_sorted(probs, 0.9, scores=x), hf_keep(x, 0.9))


def test_rows_that_mislead_the_sample_are_sorted_whole():
    # Only the tokens up to the cut are sorted in order, under a ceiling estimated from every 128th
    # token; a row whose sample misleads is sorted again whole, with the same result.
    x = rows(3, 20000, seed=9)
    x[0, ::_top_p_sorted._SAMPLE] += 8.0  # the sample sees big tokens only, and the cut lies among them
    x[1, ::_top_p_sorted._SAMPLE] -= 30.0  # ... tiny ones only: no ceiling at all
    probs = torch.softmax(x, dim=-1)
    expected = hf_keep(x, 0.9)
    cut = rounds_at_most(float32(0.1))[0]
    ceiling = torch.from_numpy(_top_p_sorted._ceiling(probs.numpy(), cut))[:, 0]
    assert ceiling[0] < probs[0][expected[0]].min() and ceiling[1] == float("inf") and ceiling[2] < 1
    assert torch.equal(top_p_mask_sorted(probs, 0.9, scores=x), expected)
    assert torch.equal(top_p_mask_sorted(probs, 0.9, scores=x), top_p_mask(probs, 0.9, scores=x))


def test_ties_split_by_the_cut_keep_the_highest_scores():
    # Distinct scores with equal float32 probabilities: HF's sort of the scores removes the lowest.
    x = (torch.arange(10000).double() * 1e-12).float()[None]
    shuffled = x[:, torch.randperm(10000, generator=torch.Generator().manual_seed(0))]
    for scores in (x, x.flip(-1), shuffled):
        probs = torch.softmax(scores, dim=-1)
        for top_p, keep in ((0.5, 1), (0.3, 1), (1e-9, 7)):
            assert torch.equal(top_p_mask_sorted(probs, top_p, keep, scores=scores), hf_keep(scores, top_p, keep))


def test_ties_of_equal_scores_keep_the_lowest_ids():
    # HF's order among exactly equal scores is torch.sort's (unspecified); here the lowest ids, as the radix.
    for scores in (torch.zeros(1, 4), torch.randint(0, 4, (5, 3000), generator=torch.Generator().manual_seed(4)).float()):
        probs = torch.softmax(scores, dim=-1)
        for top_p in (0.2, 0.5, 0.77):
            out = top_p_mask_sorted(probs, top_p, scores=scores)
            assert torch.equal(out, top_p_mask(probs, top_p, scores=scores))
            assert torch.equal(out.sum(-1), hf_keep(scores, top_p).sum(-1))
            assert torch.equal(top_p_mask_sorted(probs, top_p), top_p_mask(probs, top_p))  # no scores: by id
    assert top_p_mask_sorted(torch.full((1, 4), 0.25), 0.5).tolist() == [[True, True, False, False]]


def test_zero_probabilities_at_the_cut_rank_by_score():
    # exp underflows to 0 for distinct scores: min_tokens_to_keep reaches into them, HF keeps the highest.
    x = torch.tensor([[0.0, -200.0, -300.0, NEG_INF, -250.0, -1.0]])
    probs = torch.softmax(x, dim=-1)
    for keep in (3, 4, 5, 6, 9):
        assert torch.equal(top_p_mask_sorted(probs, 0.1, keep, scores=x), hf_keep(x, 0.1, keep)), keep


def test_rows_without_a_distribution_keep_everything():
    x = rows(4, 2000, seed=5)
    x[1, 7] = float("nan")
    x[2, 3] = float("inf")
    x[3] = NEG_INF
    probs = torch.softmax(x, dim=-1)
    out = top_p_mask_sorted(probs, 0.5, scores=x)
    assert out[1:].all()
    assert torch.equal(out, hf_keep(x, 0.5) | torch.isnan(probs))  # HF keeps them too (its NaN compares False)
    assert torch.equal(out, top_p_mask(probs, 0.5, scores=x))
    partial = torch.tensor([[0.5, float("nan"), 0.2, 0.3]])  # not from a softmax: still kept whole
    assert top_p_mask_sorted(partial, 0.1).all()


def test_caller_tensors_untouched_and_empty_shapes():
    x = rows(3, 5000, seed=6)
    probs = torch.softmax(x, dim=-1)
    before = probs.clone(), x.clone()
    top_p_mask_sorted(probs, 0.9, scores=x)
    assert torch.equal(probs, before[0]) and torch.equal(x, before[1])
    assert top_p_mask_sorted(torch.zeros(0, 5), 0.9).shape == (0, 5)
    strided = torch.softmax(rows(4, 3000, seed=7), dim=-1)[::2]  # a non-contiguous view
    assert torch.equal(top_p_mask_sorted(strided, 0.9), top_p_mask(strided.contiguous(), 0.9))


def test_memory_is_the_mask_plus_one_chunk():
    # Deterministic, not timed: NumPy's allocations as traced by tracemalloc. The result (1 byte a
    # token) and one chunk being sorted (float32), plus small per-row arrays; never a copy of the input.
    x = rows(32, 128256, seed=8) / 0.8
    probs = torch.softmax(x, dim=-1)
    top_p_mask_sorted(probs, 0.9, scores=x)
    tracemalloc.start()
    try:
        top_p_mask_sorted(probs, 0.9, scores=x)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < probs.numel() + 4 * _top_p_sorted._CHUNK + (1 << 20)
    assert peak < 0.5 * probs.numel() * probs.element_size()


def test_docstring_examples():
    failures, tried = doctest.testmod(_top_p_sorted, optionflags=doctest.ELLIPSIS)
    assert tried >= 2 and failures == 0
