"""One CPU row through top-k, top-p and min-p on NumPy (`OneRow`): the batched route's scores bit for bit,
the same token as the batched route's one-row draw for the same seed, and HF's kept set."""

import numpy as np
import torch
from _zipf import zipf
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fast_ties import adversarial_rows
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge._step.fast.fast_path import _run, fast_draw, fast_scores
from hfbridge._step.fast.pending import Candidates, OneRow

NEG_INF = float("-inf")


def _chain(temperature, top_k, top_p, min_p, at_least, order):
    parts = {"T": [hf.TemperatureLogitsWarper(temperature)] if temperature else [],
             "K": [hf.TopKLogitsWarper(top_k)],
             "P": [hf.TopPLogitsWarper(top_p, min_tokens_to_keep=at_least)] if top_p else [],
             "M": [hf.MinPLogitsWarper(min_p)] if min_p else []}
    return LogitsProcessorList([p for key in order for p in parts[key]])


def _row(kind, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "zipf":
        return zipf(1, vocab, seed=seed)
    x = torch.randn(1, vocab, generator=g) * 3
    if kind == "ties":  # many exactly equal scores, at the cut too
        return (x * 2).round() / 2
    if kind == "inf":
        x[0, seed % vocab] = float("inf")
    if kind == "neginf":
        x[0, torch.rand(vocab, generator=g) < 0.995] = NEG_INF  # fewer finite scores than the top-k
    return x


chains = dict(temperature=st.sampled_from([None, 0.3, 0.8, 1.7, 1e-3]), top_k=st.integers(1, 80),
              top_p=st.sampled_from([None, 0.3, 0.9, 0.95, 0.999]), min_p=st.sampled_from([None, 0.01, 0.05, 0.4]),
              at_least=st.sampled_from([1, 3]), order=st.sampled_from(["TKPM", "TKMP", "KPMT", "TKP", "TKM"]))


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["randn", "zipf", "ties", "inf", "neginf"]), vocab=st.sampled_from([5000, 32000]),
       seed=st.integers(0, 2**20), **chains)
def test_one_row_equals_the_batched_route(kind, vocab, seed, temperature, top_k, top_p, min_p, at_least, order):
    x = _row(kind, vocab, seed)
    processors = _chain(temperature, top_k, top_p, min_p, at_least, order)
    one = fast_scores(None, x.clone(), processors)  # [1, V]: the one-row route
    batched = fast_scores(None, x.repeat(2, 1), processors)  # [2, V]: the batched candidates
    assert torch.equal(one, batched[:1]) and torch.equal(one, batched[1:])
    # the one-row route keeps HF's set: only exactly equal scores straddling a cut may swap places
    expected = processors(None, x.clone())
    assert int(torch.isfinite(one).sum()) == int(torch.isfinite(expected).sum()) or kind == "inf"
    if kind != "ties":
        assert torch.equal(one, expected) or kind == "inf"


@settings(max_examples=300, deadline=None)
@given(x=adversarial_rows(), **chains)
def test_one_row_on_adversarial_magnitudes(x, temperature, top_k, top_p, min_p, at_least, order):
    x = x[:1].repeat(1, 4096 // x.shape[1] + 1)[:, :4096]  # 64 groups: the one-row top-k takes it
    processors = _chain(temperature, top_k, top_p, min_p, at_least, order)
    one = fast_scores(None, x.clone(), processors)
    assert torch.equal(one, fast_scores(None, x.repeat(2, 1), processors)[:1])


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**20), draw_seed=st.integers(0, 2**31), **chains)
def test_one_row_draws_the_batched_one_rows_token(seed, draw_seed, temperature, top_k, top_p, min_p, at_least,
                                                  order):
    """The token a `OneRow` draws is the one the `Candidates` of the same row drew (the previous route):
    all K candidates' weights, the removed masked, the same uniform."""
    x = _row("zipf", 32000, seed)
    processors = _chain(temperature, top_k, top_p, min_p, at_least, order)
    state = _run(None, x.clone(), processors, True)
    pending = state.pending
    assert isinstance(pending, OneRow) or not isinstance(pending, Candidates)
    if not isinstance(pending, OneRow):
        return
    size = pending.cand.shape[0]
    kept = size if pending.kept is None else pending.kept
    as_candidates = Candidates(torch.from_numpy(pending.ids)[None], torch.from_numpy(pending.cand)[None],
                               torch.from_numpy(np.arange(size) < kept)[None], all_kept=kept == size)
    ours = pending.draw(state.scores, torch.Generator().manual_seed(draw_seed))
    theirs = as_candidates.draw(state.scores, torch.Generator().manual_seed(draw_seed))
    assert ours[0].tolist() == theirs[0].tolist() and ours[1] == theirs[1]
    token = int(ours[0])
    assert bool(torch.isfinite(fast_scores(None, x.clone(), processors)[0, token]))


def test_a_temperature_that_overflows_a_score_warns_nothing(recwarn):
    x = zipf(1, 8192, seed=1)
    x[0, 5] = 3e38  # divided by 0.5: inf, as torch's division gives it
    processors = _chain(0.5, 40, None, None, 1, "TK")
    one = fast_scores(None, x.clone(), processors)
    assert isinstance(_run(None, x.clone(), processors, True).pending, OneRow)
    assert torch.equal(one, processors(None, x.clone())) and one[0, 5] == float("inf")
    assert not [w for w in recwarn if "overflow" in str(w.message)]


def test_the_one_row_route_takes_a_per_row_temperature_and_top_p():
    """A merged per-row group of one row holds `(1, 1)` tensors (`tensor_temperature`, `tensor_top_p`)."""
    from hfbridge._step.plan.per_row import tensor_temperature, tensor_top_p

    x = zipf(1, 32000, seed=3)
    ours = LogitsProcessorList([tensor_temperature(torch.tensor([[0.7]])), hf.TopKLogitsWarper(40),
                                tensor_top_p([0.9])])
    theirs = _chain(0.7, 40, 0.9, None, 1, "TKP")
    assert isinstance(_run(None, x.clone(), ours, True).pending, OneRow)
    assert torch.equal(fast_scores(None, x.clone(), ours), theirs(None, x.clone()))
    result = fast_draw(None, x.clone(), ours, torch.Generator().manual_seed(0))
    assert bool(torch.isfinite(theirs(None, x.clone())[0, result.tokens[0]]))


def test_top_p_after_min_p_keeps_what_min_p_removed_removed():
    """HF's `min_tokens_to_keep` keeps the last tokens of its sort: after min-p those may be -inf already,
    and stay so (the batched route too)."""
    x = zipf(1, 32000, seed=0)
    processors = _chain(None, 40, 0.3, 0.4, 3, "KMP")
    one = fast_scores(None, x.clone(), processors)
    expected = processors(None, x.clone())
    assert int(torch.isfinite(expected).sum()) < 3  # min-p left fewer than top-p's `min_tokens_to_keep`
    assert torch.equal(one, expected)
    assert torch.equal(fast_scores(None, x.repeat(2, 1), processors), expected.repeat(2, 1))
