"""The candidate route at large vocabularies: grouped top-k, the certified total, HF's surviving set."""

import pytest
import torch
from _zipf import zipf
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge._step.fast.candidates import certified_total, top_candidates, top_p_candidates, top_p_count

NEG_INF = float("-inf")


@pytest.mark.parametrize(("vocab", "k"), [(128256, 512), (128256, 64), (32000, 500), (50257, 512), (4099, 33),
                                          (262144, 1000), (4096, 64), (8191, 1)])
def test_grouped_candidates_are_torch_topk(vocab, k):
    g = torch.Generator().manual_seed(vocab + k)
    rows = [torch.randn(2, vocab, generator=g), torch.randint(0, 30, (2, vocab), generator=g).float(),
            zipf(2, vocab, seed=k)]
    sparse = torch.full((2, vocab), NEG_INF)
    sparse[:, -40:] = torch.randn(2, 40, generator=g)  # the finite scores in the last, partial group
    sparse[1, :3] = 5.0
    for x in rows + [sparse]:
        values, ids = top_candidates(x, k)
        assert torch.equal(values, torch.topk(x, k).values)
        assert torch.equal(x.gather(1, ids), values)
        assert all(len(set(row.tolist())) == k for row in ids)
        ties = values[:, 1:] == values[:, :-1]
        assert bool((ids[:, 1:] > ids[:, :-1])[ties].all())  # equal scores in id order


def test_grouped_candidates_of_a_strided_row():
    x = torch.randn(3, 2 * 70000, generator=torch.Generator().manual_seed(1))[:, ::2]  # not contiguous
    values, ids = top_candidates(x, 512)
    assert torch.equal(values, torch.topk(x, 512).values) and torch.equal(x.gather(1, ids), values)


def exact_total(probs):
    return probs.sum(dim=-1, keepdim=True, dtype=torch.float64)


@pytest.mark.parametrize("vocab", [64, 1000, 32000, 128256, 50257])
def test_certified_total_contains_the_float64_sum(vocab):
    g = torch.Generator().manual_seed(vocab)
    rows = [
        torch.softmax(torch.randn(3, vocab, generator=g) * 3, dim=-1),
        torch.softmax(zipf(3, vocab, seed=vocab), dim=-1),
        torch.full((2, vocab), 1 / vocab),  # equal probabilities: float32 partial sums round
        torch.full((1, vocab), 1 / 3) * torch.rand(1, vocab, generator=g),
        torch.full((1, vocab), 1e-40),  # subnormal
        torch.zeros(1, vocab),
    ]
    for probs in rows:
        total, slack, _ = certified_total(probs)
        assert bool(((total - exact_total(probs)).abs() <= slack).all())
        assert bool((slack <= 1e-6 * total + 1e-30).all())
    non_contiguous = rows[0].t().contiguous().t()
    total, slack, partial = certified_total(non_contiguous)
    assert partial.shape == (3, -(-vocab // 16))  # sums of 16 tokens (the last: the rest), reused by the draw
    assert torch.allclose(partial.sum(dim=-1, dtype=torch.float64), total[:, 0])
    assert bool(((total - exact_total(non_contiguous)).abs() <= slack).all())


@pytest.mark.parametrize("vocab", [32000, 128256])
def test_candidate_counts_equal_the_exact_total_route(vocab):
    # The count from the certified total is the count with the exact float64 total: where the slack
    # leaves it open, that row is recomputed exactly.
    for temperature in (0.6, 0.8, 0.9):
        scores = zipf(6, vocab, seed=vocab) / temperature
        probs = torch.softmax(scores, dim=-1)
        for top_p in (0.5, 0.8, 0.9, 0.95):
            tried = top_p_candidates(scores, probs, top_p, 1)
            if not tried.proved:
                continue
            ids, keep = tried.ids, tried.keep()
            picked = probs.gather(1, ids)
            rest = (exact_total(probs) - picked.double().sum(dim=-1, keepdim=True)).clamp(min=0)
            assert torch.equal(keep.sum(dim=-1, keepdim=True), top_p_count(picked, rest, top_p, 1))


def test_count_decided_exactly_when_the_cut_sits_within_the_slack():
    # Equal probabilities 1/n summed in float32 round; the cut lands exactly on a whole number of
    # tokens, so only the exact float64 total decides (at a large vocabulary).
    vocab = 40960
    x = (torch.randperm(vocab, generator=torch.Generator().manual_seed(0)).double() * (1e-8 / vocab)).float()[None]
    assert torch.softmax(x, dim=-1).unique().numel() == 1
    for top_p in (256 / vocab, 300 / vocab, 384 / vocab, 0.01):
        processors = LogitsProcessorList([hf.TopPLogitsWarper(top_p)])
        ref = processors(None, x.clone()) > NEG_INF
        probs = torch.softmax(x, dim=-1)
        tried = top_p_candidates(x, probs, top_p, 1)
        assert tried.proved
        ids, keep = tried.ids, tried.keep()
        assert int(keep.sum()) == int(ref.sum())
        assert set(ids[keep].tolist()) == set(ref.nonzero()[:, 1].tolist())


@pytest.mark.parametrize("vocab", [600, 5000, 32000, 50257, 128256])
def test_candidates_said_to_fail_never_hold_the_cut(vocab):
    # The bound only skips candidates that cannot prove the cut (the route, and so the tokens, are
    # what trying them gives); on flat rows and Zipf-like rows at temperature 1 it does skip them.
    from hfbridge._step.fast.candidates import candidates_cannot_hold

    g = torch.Generator().manual_seed(vocab)
    said = {}
    for kind, x in (("flat", torch.randn(4, vocab, generator=g)), ("zipf", zipf(4, vocab, seed=vocab))):
        for temperature in (0.5, 0.7, 0.8, 0.9, 1.0, 1.5):
            scores = x / temperature
            probs = torch.softmax(scores, dim=-1)
            for top_p in (0.5, 0.8, 0.9, 0.95, 0.99):
                for rows in (slice(0, 4), slice(1, 2)):
                    hopeless = candidates_cannot_hold(certified_total(probs[rows]), top_p, vocab)
                    tried = top_p_candidates(scores[rows], probs[rows], top_p, 1)
                    assert not (hopeless and tried.proved), (kind, temperature, top_p)
                    said[kind, temperature, top_p] = hopeless
    if vocab >= 32000:
        assert said["flat", 1.0, 0.9] and said["zipf", 1.0, 0.9]
        assert not said["zipf", 0.7, 0.9]


def test_a_sampler_reused_across_steps_draws_what_fresh_ones_draw():
    # The memo sizes the first try after the last step's count; as the count moves between steps
    # (a smaller try fails, a larger one is needed, the draw route comes and goes), the tokens are
    # those of a sampler without history.
    from hfbridge import Sampler

    noise = torch.Generator().manual_seed(9)
    x = zipf(4, 40000, seed=9)
    reused = Sampler(do_sample=True, top_p=0.9, top_k=0, fast=True, generator=torch.Generator())
    for step, temperature in enumerate((0.6, 0.8, 0.75, 1.0, 0.7, 0.9, 0.65, 0.85)):
        logits = x / temperature + 0.05 * torch.randn(x.shape, generator=noise)
        reused.generator.manual_seed(step)
        fresh = Sampler(do_sample=True, top_p=0.9, top_k=0, fast=True, generator=torch.Generator().manual_seed(step))
        assert torch.equal(reused(logits), fresh(logits)), temperature
