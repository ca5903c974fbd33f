"""The fixed-shape candidate route (`_fixed_shape.py`): HF's top-p set from a fixed number of
candidates when a device flag proves they hold the cut, the radix select otherwise."""

import doctest

import pytest
import torch
from _host_reads import HostReads
from _zipf import zipf
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge._step.fast.fast_path import fast_draw
from hfbridge._step.fast.ordered_topk import ordered_topk
from hfbridge._step.fast.top_p import compiled as _fixed_shape
from hfbridge._step.fast.top_p.compiled import block_topk, candidate_cut, fixed_top_p, top_p_keep

NAN, INF, NEG_INF = float("nan"), float("inf"), float("-inf")


@st.composite
def rows(draw_):
    """A batch mixing rows whose cut the candidates hold and rows whose cut they do not."""
    vocab = draw_(st.integers(1, 3100))
    seed = draw_(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    kinds = draw_(st.lists(st.sampled_from(["zipf", "flat", "ties", "neg-inf", "spiky", "equal"]),
                           min_size=1, max_size=4))
    out = []
    for kind in kinds:
        if kind == "zipf":
            row = zipf(1, vocab, seed)[0]
        elif kind == "flat":
            row = torch.randn(vocab, generator=g)
        elif kind == "ties":  # few distinct values: ties at every boundary
            row = torch.randint(0, 4, (vocab,), generator=g).float()
        elif kind == "neg-inf":  # a few tokens left by an earlier filter
            row = torch.full((vocab,), NEG_INF)
            row[torch.randperm(vocab, generator=g)[: draw_(st.integers(1, 40))]] = torch.randn(1, generator=g)
        elif kind == "spiky":
            row = torch.randn(vocab, generator=g)
            row[vocab // 2] = 30.0
        else:
            row = torch.zeros(vocab)
        out.append(row)
    return torch.stack(out)


def hfs_keep(scores, top_p, at_least):
    return hf.TopPLogitsWarper(top_p, min_tokens_to_keep=at_least)(None, scores.clone()) > NEG_INF


def assert_hfs_set(scores, ref, keep):
    """HF's surviving tokens (`ref`, a mask of HF's scores above -inf) among `scores` where `keep`;
    a row with exactly equal finite scores may keep other equal tokens (HF's order among them is
    unspecified), never another number of them."""
    keep = keep & (scores > NEG_INF)  # a kept -inf score is not a surviving token
    for row, r, o in zip(scores, ref, keep):
        finite = row[torch.isfinite(row)]
        if finite.unique().numel() == finite.numel():
            assert torch.equal(r, o), (r.nonzero()[:, 0].tolist(), o.nonzero()[:, 0].tolist())
        else:
            assert int(r.sum()) == int(o.sum())


@settings(max_examples=80, deadline=None)
@given(x=rows(), top_p=st.floats(0.0, 1.0), at_least=st.integers(1, 20), k=st.sampled_from([1, 16, 64, 512]),
       temperature=st.sampled_from([0.05, 0.8, 1.0, 3.0]))
def test_both_routes_keep_hfs_set(x, top_p, at_least, k, temperature):
    scores = x / temperature
    probs = torch.softmax(scores, dim=-1)
    ref = hfs_keep(scores, top_p, at_least)
    both = top_p_keep(scores, probs, top_p, at_least, route="both", k=k)
    assert_hfs_set(scores, ref, both)
    # Where the flag is set the candidates alone give exactly the radix select's answer.
    _, _, holds = candidate_cut(scores, probs, top_p, at_least, min(k, x.shape[-1]))
    candidates = top_p_keep(scores, probs, top_p, at_least, route="candidates", k=k)
    radix = top_p_keep(scores, probs, top_p, at_least, route="radix")
    assert torch.equal(candidates[holds[:, 0]], radix[holds[:, 0]])
    assert torch.equal(both, torch.where(holds, candidates, radix))
    # The compiled route's cut (the total from the exponentials' sum, within a bound): HF's set too,
    # the candidates' answer where its flag is set, the radix select's elsewhere.
    cut = fixed_top_p(scores, top_p, at_least, k)
    applied = cut.apply(NEG_INF, route="both")
    assert_hfs_set(scores, ref, applied > NEG_INF)
    sure = cut.holds[:, 0]
    assert torch.equal(applied[~sure] > NEG_INF, radix[~sure] & (scores[~sure] > NEG_INF))
    # kept candidates that can be drawn (min_tokens_to_keep may keep a -inf one, which HF leaves at -inf)
    drawable = cut.keep & (cut.cand > NEG_INF)
    assert bool((drawable.sum(dim=-1)[sure] == (applied[sure] > NEG_INF).sum(dim=-1)).all())


def test_the_flag_is_set_on_realistic_rows_and_unset_on_flat_ones():
    x = torch.cat([zipf(3, 32000, seed=1), torch.randn(1, 32000, generator=torch.Generator().manual_seed(1))])
    scores = x / 0.8
    probs = torch.softmax(scores, dim=-1)
    holds = candidate_cut(scores, probs, 0.9, 1, 512)[2]
    assert holds[:, 0].tolist() == [True, True, True, False]
    assert_hfs_set(scores, hfs_keep(scores, 0.9, 1), top_p_keep(scores, probs, 0.9, 1, route="both"))


@pytest.mark.parametrize("at_least", [1, 2, 5, 511, 512, 600])
def test_min_tokens_to_keep(at_least):
    # At or above the candidate count the flag is unset: the radix select keeps them.
    x = zipf(3, 4096, seed=at_least)
    x[1] = x[1] * 40  # one dominant token
    scores = x / 0.7
    probs = torch.softmax(scores, dim=-1)
    ref = hfs_keep(scores, 0.9, at_least)
    assert_hfs_set(scores, ref, top_p_keep(scores, probs, 0.9, at_least, route="both"))
    _, _, holds = candidate_cut(scores, probs, 0.9, at_least, 512)
    assert bool(holds.all()) == (at_least < 512)


@pytest.mark.parametrize("top_k", [5, 50, 700])
def test_top_k_before_top_p(top_k):
    # HF's top-k leaves k scores; the candidates hold them all when k is below the candidate count.
    x = torch.cat([zipf(2, 5000, seed=3), torch.randn(2, 5000, generator=torch.Generator().manual_seed(3))])
    scores = hf.TopKLogitsWarper(top_k)(None, x / 0.7)
    probs = torch.softmax(scores, dim=-1)
    assert_hfs_set(scores, hfs_keep(scores, 0.95, 1), top_p_keep(scores, probs, 0.95, 1, route="both"))
    _, _, holds = candidate_cut(scores, probs, 0.95, 1, 512)
    assert bool(holds.all()) == (top_k < 512)


def test_rows_without_a_distribution_keep_every_token():
    x = zipf(4, 3000, seed=4) / 0.6
    x[1, 17] = NAN
    x[2, 5] = INF
    x[3] = NEG_INF
    probs = torch.softmax(x, dim=-1)
    _, _, holds = candidate_cut(x, probs, 0.9, 1, 512)
    assert holds[:, 0].tolist() == [True, False, False, False]
    for route in ("both", "radix"):
        keep = top_p_keep(x, probs, 0.9, 1, route=route)
        assert keep[1:].all() and not keep[0].all()
    # Every token a candidate: no flag needed, the same answer.
    keep = top_p_keep(x[:, :300], torch.softmax(x[:, :300], dim=-1), 0.9, 1, route="cond")
    assert keep[1:].all() and torch.equal(keep[0], hfs_keep(x[:1, :300], 0.9, 1)[0])


@pytest.mark.parametrize("vocab", [3001, 8192, 32000, 50257, 128256])
def test_ordered_topk_is_the_top_k_in_hfs_order(vocab):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(4, vocab, generator=g)
    x[1] = torch.randint(0, 3, (vocab,), generator=g).float()  # ties at every place: ascending ids
    x[2, : vocab - 5] = NEG_INF  # fewer finite scores than k: every one of them is found
    x[3, 7], x[3, 9] = 0.0, -0.0  # equal scores
    for k in (1, 64, 512):
        values, ids, best = ordered_topk(x, k)
        assert torch.equal(values, torch.topk(x, k).values) and torch.equal(x.gather(1, ids), values)
        assert torch.equal(best, x.amax(dim=-1, keepdim=True)) and bool((ids < vocab).all())
        tied = (values[:, 1:] == values[:, :-1]) & (values[:, 1:] > NEG_INF)  # -inf: padding may repeat an id
        assert bool((ids[:, 1:][tied] > ids[:, :-1][tied]).all())
        finite = ids[2][values[2] > NEG_INF].tolist()
        assert len(finite) == min(k, 5) and set(finite) <= set(range(vocab - 5, vocab))


def test_the_compiled_draw_is_the_candidate_routes_draw():
    # Same seed, same uniform numbers: where the candidates hold the cut, the fixed-shape draw over
    # them gives the token the eager candidate route gives (pick over exp(cand - best)); where they
    # do not, the one the eager fixed-shape route gives (the radix select's mask, draw_checked).
    processors = LogitsProcessorList([hf.TemperatureLogitsWarper(0.8), hf.TopPLogitsWarper(0.9)])
    x = zipf(6, 32000, seed=7)
    flat = torch.randn(6, 32000, generator=torch.Generator().manual_seed(7))
    for rows, candidates, sure in ((x, True, True), (flat, False, False)):
        scores = rows / 0.8
        cut = fixed_top_p(scores, 0.9, 1)
        assert bool(cut.holds.all()) == sure
        for seed in range(5):
            torch.manual_seed(seed)
            tokens, valid = cut.draw(route="both")
            torch.manual_seed(seed)
            assert torch.equal(tokens, fast_draw(None, rows.clone(), processors, candidates=candidates).tokens)
            assert bool(valid.all())


def test_the_compiled_draw_samples_hfs_distribution():
    # Chi-square over 3 rows, 8000 draws each: the fixed-shape draw over the candidates against
    # softmax(HF's final scores).
    processors = LogitsProcessorList([hf.TemperatureLogitsWarper(2.0), hf.TopPLogitsWarper(0.6)])
    x = zipf(3, 4096, seed=8, exponent=3.0)
    cut = fixed_top_p(x / 2.0, 0.6, 1)
    assert bool(cut.holds.all())
    probs = torch.softmax(processors(None, x.clone()), dim=-1)  # [3, V]
    torch.manual_seed(8)
    draws = torch.stack([cut.draw(route="candidates")[0] for _ in range(8000)], dim=1)  # [3, 8000]
    for row in range(3):
        support = probs[row].nonzero()[:, 0]
        assert 3 <= support.numel() <= 60
        counts = torch.bincount(draws[row], minlength=4096)
        assert int(counts.sum() - counts[support].sum()) == 0  # never a removed token
        expected = probs[row, support].double() * 8000
        stat = float(((counts[support].double() - expected) ** 2 / expected).sum())
        assert stat < support.numel() + 5 * (2 * support.numel()) ** 0.5  # mean + 5 sd of chi2(n)


@pytest.mark.parametrize("vocab", [2048, 3001, 32000, 50257])
def test_block_topk_is_the_top_k(vocab):
    x = torch.randn(3, vocab, generator=torch.Generator().manual_seed(vocab))
    x[1, : vocab - 5] = NEG_INF  # fewer finite scores than k: every one of them is found
    for k in (1, 16, 64):
        values, ids = block_topk(x, k)
        assert torch.equal(values, torch.topk(x, k).values)
        assert torch.equal(x.gather(1, ids), values) and bool((ids < vocab).all())


def test_eager_fixed_shape_route_reads_no_device_value():
    x = torch.cat([zipf(2, 4096, seed=5), torch.randn(1, 4096, generator=torch.Generator().manual_seed(5))])
    x[1, 9] = NAN
    chains = ([hf.TemperatureLogitsWarper(0.8), hf.TopPLogitsWarper(0.9)],
              [hf.TopKLogitsWarper(50), hf.TopPLogitsWarper(0.9, min_tokens_to_keep=3)])
    for processors in chains:
        with HostReads() as reads:
            out = fast_draw(None, x.clone(), processors, candidates=False)
        assert reads.count == 0, reads.ops
        assert out.valid.tolist() == [True, False, True]
    scores = x / 0.8
    with HostReads() as reads:
        top_p_keep(scores, torch.softmax(scores, dim=-1), 0.9, 1, route="both")
    assert reads.count == 0, reads.ops


def test_compiled_route_keeps_hfs_set_and_flags_bad_rows():
    # One compiled graph (aot_eager: cheap, no C++ toolchain), run on a batch whose cut the
    # candidates hold and on one that needs the radix select: torch.cond takes both branches.
    processors = LogitsProcessorList([hf.TemperatureLogitsWarper(0.8), hf.TopPLogitsWarper(0.9, min_tokens_to_keep=2)])

    def step(scores):
        out = fast_draw(None, scores, processors, candidates=False)
        return out.tokens, out.valid, out.final_scores()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    realistic = zipf(5, 4096, seed=6)
    bad = realistic.clone()
    bad[1] = torch.randn(4096, generator=torch.Generator().manual_seed(6))  # flat: the radix select
    bad[2, 17], bad[3, 5], bad[4] = NAN, INF, NEG_INF
    for x, valid in ((realistic, [True] * 5), (bad, [True, True, False, False, False])):
        scores = x / 0.8
        holds = candidate_cut(scores, torch.softmax(scores, dim=-1), 0.9, 2, _fixed_shape.CANDIDATES)[2]
        assert bool(holds.all()) == (x is realistic)
        torch.manual_seed(0)
        tokens, flags, final = compiled(x.clone())
        assert flags.tolist() == valid
        good = torch.tensor(valid)
        ref = processors(None, x.clone())[good]
        assert_hfs_set(x[good], ref > NEG_INF, final[good] > NEG_INF)
        assert torch.equal(ref, final[good])
        assert bool((final[good].gather(1, tokens[good, None]) > NEG_INF).all())
        assert bool((tokens >= 0).all() and (tokens < 4096).all())


def test_docstring_examples():
    failures, tried = doctest.testmod(_fixed_shape)
    assert tried >= 3 and failures == 0
