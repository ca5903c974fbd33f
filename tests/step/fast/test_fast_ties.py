"""HF's surviving set for every row of distinct scores, at any magnitude; ties in probability by score."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge import Sampler
from hfbridge._step.fast.candidates import top_candidates
from hfbridge._step.fast.fast_path import fast_scores
from hfbridge._step.fast.top_p.mask import keep_highest

NEG_INF = float("-inf")
BOTH = pytest.mark.parametrize("candidates", [True, False], ids=["candidates", "fixed-shape"])


def kept_ids(processors, x, candidates):
    return (fast_scores(None, x.clone(), processors, candidates=candidates) > NEG_INF).nonzero()[:, 1].tolist()


@BOTH
def test_probability_ties_are_broken_by_score(candidates):
    # Distinct scores whose float32 probabilities are all equal: HF's sort of the scores removes the lowest.
    x = (torch.arange(10000).double() * 1e-12).float()[None]
    assert kept_ids([hf.TopPLogitsWarper(0.5)], x, candidates) == list(range(5000, 10000))
    reversed_ = x.flip(-1)
    assert kept_ids([hf.TopPLogitsWarper(0.5)], reversed_, candidates) == list(range(5000))
    shuffled = x[:, torch.randperm(10000, generator=torch.Generator().manual_seed(0))]
    ref = LogitsProcessorList([hf.TopPLogitsWarper(0.3)])(None, shuffled.clone()) > NEG_INF
    assert kept_ids([hf.TopPLogitsWarper(0.3)], shuffled, candidates) == ref.nonzero()[:, 1].tolist()
    # min_tokens_to_keep: HF's last 7 in score order.
    assert kept_ids([hf.TopPLogitsWarper(1e-9, min_tokens_to_keep=7)], x, candidates) == list(range(9993, 10000))


def test_keep_highest_is_a_selection_by_score():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(5, 700, generator=g) * torch.tensor([[1e-30], [1e-5], [1.0], [1e5], [1e30]])
    scores[:, ::7] *= -1
    mask = torch.rand(5, 700, generator=g) < 0.5
    count = torch.tensor([[0], [1], [37], [350], [700]], dtype=torch.int32)
    out = keep_highest(mask, scores, count)
    for row in range(5):
        candidates = scores[row][mask[row]]
        n = min(int(count[row]), candidates.numel())
        expected = set(mask[row].nonzero()[:, 0][candidates.topk(n).indices].tolist()) if n else set()
        assert set(out[row].nonzero()[:, 0].tolist()) == expected


@st.composite
def adversarial_rows(draw):
    """Rows of scores at any magnitude: near-equal (probability ties), huge, tiny, or rounded to fp16/bf16."""
    batch = draw(st.integers(1, 3))
    vocab = draw(st.integers(2, 600))
    seed = draw(st.integers(0, 2**31 - 1))
    kind = draw(st.sampled_from(["spread", "near-equal", "from-half", "from-bf16", "two-scales"]))
    scale = 10.0 ** draw(st.integers(-30, 30))
    g = torch.Generator().manual_seed(seed)
    order = torch.stack([torch.randperm(vocab, generator=g) for _ in range(batch)]).double()  # [B, V]
    if kind == "spread":  # distinct, evenly spaced at this scale
        x = order * scale
    elif kind == "near-equal":  # one offset plus tiny distinct steps: float32 probabilities tie
        x = draw(st.sampled_from([0.0, 1.0, -3.0, 20.0])) + order * scale * 1e-12
    elif kind == "two-scales":  # a few large scores, the rest tiny steps
        x = order * 1e-9 + (order > vocab - 4) * scale
    else:  # logits produced in half precision, then upcast as HF does
        x = torch.randn(batch, vocab, generator=g, dtype=torch.float64) * min(scale, 1e4)
        x = x.to(torch.float16 if kind == "from-half" else torch.bfloat16)
    x = x.float()
    return x.clamp(-3e38, 3e38)


def assert_hfs_set(x, ref, out):
    """HF's surviving tokens and scores; only a row with exactly equal finite scores may differ, by
    which of the equal tokens it keeps (HF's order among them is unspecified), never by how many."""
    for row, r, o in zip(x, ref, out):
        kept_r, kept_o = r > NEG_INF, o > NEG_INF
        finite = row[torch.isfinite(row)]
        if finite.unique().numel() == finite.numel():
            assert torch.equal(kept_r, kept_o), (kept_r.nonzero()[:, 0].tolist(), kept_o.nonzero()[:, 0].tolist())
            assert torch.equal(r, o)
        else:
            assert int(kept_r.sum()) == int(kept_o.sum())


@BOTH
@settings(max_examples=150, deadline=None)
@given(x=adversarial_rows(), top_p=st.floats(0.0, 1.0), keep=st.integers(1, 3),
       temperature=st.sampled_from([None, 0.05, 0.7, 1.0, 3.0]), top_k=st.sampled_from([None, 5, 100]))
def test_surviving_set_equals_hfs_on_adversarial_rows(candidates, x, top_p, keep, temperature, top_k):
    chain = ([hf.TemperatureLogitsWarper(temperature)] if temperature else []) + \
        ([hf.TopKLogitsWarper(top_k)] if top_k else []) + [hf.TopPLogitsWarper(top_p, min_tokens_to_keep=keep)]
    processors = LogitsProcessorList(chain)
    assert_hfs_set(x, processors(None, x.clone()), fast_scores(None, x.clone(), processors, candidates=candidates))


@BOTH
@settings(max_examples=60, deadline=None)
@given(x=adversarial_rows(), min_p=st.floats(0.0, 1.0), keep=st.integers(1, 3))
def test_min_p_surviving_set_on_adversarial_rows(candidates, x, min_p, keep):
    processors = LogitsProcessorList([hf.TemperatureLogitsWarper(0.9), hf.MinPLogitsWarper(min_p, keep)])
    assert_hfs_set(x, processors(None, x.clone()), fast_scores(None, x.clone(), processors, candidates=candidates))


def test_block_candidates_are_torch_topk():
    g = torch.Generator().manual_seed(3)
    for vocab, k in ((32000, 64), (32000, 512), (50257, 64), (50257, 512), (128256, 512), (4099, 33)):
        x = torch.randn(3, vocab, generator=g)
        x[1, : vocab // 2] = NEG_INF  # many -inf: the padded last block must not stand in for them
        x[2, -3:] = 50.0  # the best in the last, partial block
        values, ids = top_candidates(x, k)
        assert torch.equal(values, torch.topk(x, k).values)
        assert torch.equal(x.gather(1, ids), values)
        assert all(len(set(row.tolist())) == k for row in ids)
    few = torch.full((2, 5000), NEG_INF)
    few[:, :10] = torch.randn(2, 10, generator=g)  # fewer finite scores than k
    values, ids = top_candidates(few, 64)
    assert torch.equal(values, torch.topk(few, 64).values) and all(len(set(r.tolist())) == 64 for r in ids)


def test_what_a_sampler_learns_between_steps_never_changes_its_tokens():
    # The memo only skips candidate counts that would fail: a reused Sampler and fresh ones agree.
    g = torch.Generator().manual_seed(4)
    log_rank = torch.log(torch.arange(1, 20001, dtype=torch.float32))
    steps = []
    for temperature, flat in ((0.6, False), (1.0, False), (0.8, True), (0.5, False), (0.9, False), (0.7, False)):
        x = torch.randn(3, 20000, generator=g) if flat else -1.1 * log_rank[torch.randperm(20000, generator=g)][None]
        steps.append((temperature, x.expand(3, -1).contiguous() if not flat else x))
    for temperature in (0.6, 1.0):
        reused = Sampler(do_sample=True, temperature=temperature, top_p=0.9, top_k=0, fast=True,
                         generator=torch.Generator())
        for seed, (_, x) in enumerate(steps):
            reused.generator.manual_seed(seed)
            fresh = Sampler(do_sample=True, temperature=temperature, top_p=0.9, top_k=0, fast=True,
                            generator=torch.Generator().manual_seed(seed))
            assert torch.equal(reused(x), fresh(x))


def test_candidates_equal_probabilities_at_the_cut_with_distinct_scores():
    # 120 distinct scores 1e-10 apart: every float32 probability is 1/120, and 60/120 sits on top_p=0.5.
    # HF keeps the 60 highest scores. The candidate path kept 61 while it took the mass below its
    # candidates from a float32 total; it is now summed in float64, as HF's cumsum accumulates.
    x = (torch.randperm(120, generator=torch.Generator().manual_seed(0)).double() * 1e-10).float()[None]
    processors = LogitsProcessorList([hf.TopPLogitsWarper(0.5)])
    assert_hfs_set(x, processors(None, x.clone()), fast_scores(None, x.clone(), processors, candidates=True))


def test_fixed_shape_equal_probabilities_at_the_cut_with_distinct_scores():
    x = (torch.randperm(120, generator=torch.Generator().manual_seed(0)).double() * 1e-10).float()[None]
    processors = LogitsProcessorList([hf.TopPLogitsWarper(0.5)])
    assert_hfs_set(x, processors(None, x.clone()), fast_scores(None, x.clone(), processors, candidates=False))


@pytest.mark.parametrize("candidates", [True, False])
@pytest.mark.parametrize(("vocab", "top_p"), [(120, 0.5), (1000, 0.25), (1000, 0.125), (4096, 0.0625),
                                              (4096, 0.03125), (3000, 1 / 3), (640, 0.1)])
def test_equal_probabilities_at_the_cut_distinct_scores_neighbours(vocab, top_p, candidates):
    # Every float32 probability equal (scores at most 1e-8 apart), the cut at or next to a whole
    # number of tokens: both routes keep HF's count and HF's tokens (the highest scores).
    x = (torch.randperm(vocab, generator=torch.Generator().manual_seed(vocab)).double() * (1e-8 / vocab)).float()[None]
    assert torch.softmax(x, dim=-1).unique().numel() == 1
    processors = LogitsProcessorList([hf.TopPLogitsWarper(top_p)])
    assert_hfs_set(x, processors(None, x.clone()), fast_scores(None, x.clone(), processors, candidates=candidates))
