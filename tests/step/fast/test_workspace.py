"""The fast path's buffers lent from step to step (`_step/fast/workspace.py`): the same draws, the same scores,
and nothing a processor, a caller or a kept draw holds is ever written by a later step."""

import gc

import pytest
import torch
from _zipf import zipf
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation import logits_process as hf

import hfbridge._step.fast.state as state_module
from hfbridge import Sampler
from hfbridge._step.fast.fast_path import fast_draw
from hfbridge._step.fast.state import FastState
from hfbridge._step.fast.workspace import lend_like
from hfbridge.processors import TopNSigmaLogitsWarper, XTCLogitsWarper

VOCAB = 4096


def _steps(count, batch=6, seed=0):
    """Per step `(batch, VOCAB)` rows: Zipf-like and flat ones, a row with -inf runs, one hot row."""
    out = []
    for step in range(count):
        rows = torch.cat([zipf(batch // 2, VOCAB, seed=seed + step),
                          torch.randn(batch - batch // 2, VOCAB, generator=torch.Generator().manual_seed(step)) * 2])
        rows[1, ::3] = float("-inf")
        rows[-1, step] = 40.0
        out.append(rows)
    return out


class Keeper(LogitsProcessor):
    """A processor of the user's that keeps the very scores it receives (and a copy of them)."""

    def __init__(self):
        self.kept = []

    def __call__(self, input_ids, scores):
        self.kept.append((scores, scores.clone()))
        return scores


def _fresh_only(monkeypatch):
    """Lending switched off: every step computes out of place, as before lending existed."""
    monkeypatch.setattr(state_module, "lend_like", lambda like, owner, memo, key: None)


OPTIONS = [
    dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0),
    dict(do_sample=True, temperature=1.0, top_p=0.95, top_k=0),
    dict(do_sample=True, top_p=0.5, top_k=0),
    dict(do_sample=True, temperature=0.8, min_p=0.05, top_k=0),
    dict(do_sample=True, temperature=0.7, top_k=40, top_p=0.9, min_p=0.05),
    dict(do_sample=True, temperature=0.9, top_n_sigma=1.0, top_p=0.9, top_k=0),
    dict(do_sample=True, temperature=0.9, xtc_probability=0.5, xtc_threshold=0.05, top_p=0.9, top_k=0),
    dict(do_sample=True, temperature=[0.5, 0.7, 0.9, 1.1, 0.7, 0.6], top_p=[0.9, 0.8, 0.9, 0.95, 0.7, 0.9], top_k=0),
]


@pytest.mark.parametrize("options", OPTIONS, ids=[str(sorted(o)) for o in OPTIONS])
def test_a_sampler_draws_the_same_tokens_with_its_buffers_lent(options, monkeypatch):
    steps = _steps(6)
    ids = torch.zeros(6, 1, dtype=torch.long)
    lent = Sampler(fast=True, generator=torch.Generator().manual_seed(3), **options)
    with_lending = [lent(rows, ids) for rows in steps]
    _fresh_only(monkeypatch)
    fresh = Sampler(fast=True, generator=torch.Generator().manual_seed(3), **options)
    assert all(torch.equal(a, fresh(rows, ids)) for a, rows in zip(with_lending, steps, strict=True))


def _chain(*middle):
    return LogitsProcessorList([hf.TemperatureLogitsWarper(0.7), *middle, hf.TopPLogitsWarper(0.9)])


@pytest.mark.parametrize("middle", ["user", "xtc", "top_n_sigma"])
def test_what_a_processor_receives_after_the_division_is_never_written_by_a_later_step(middle):
    """A user's processor keeps its scores (a private copy each step); hfbridge's samplers get the lent
    buffer itself, and their results are those of fresh tensors."""
    keeper = Keeper()
    made = {"user": lambda: keeper, "xtc": lambda: XTCLogitsWarper(threshold=0.05, probability=1.0),
            "top_n_sigma": lambda: TopNSigmaLogitsWarper(1.0)}[middle]
    memo, draws, expected = {}, [], []
    steps = _steps(5)
    for step, rows in enumerate(steps):
        draw = fast_draw(None, rows, _chain(made()), torch.Generator().manual_seed(step), memo=memo, read_only=True)
        draws = [draw]  # the last draw kept, as a Sampler keeps it for its error message
        expected.append(fast_draw(None, rows, _chain(made()), torch.Generator().manual_seed(step)).tokens)
        assert torch.equal(draw.tokens, expected[-1])
    if middle == "user":
        kept = keeper.kept[::2]  # every other call was the fresh run's
        assert len(kept) == len(steps)
        assert all(torch.equal(scores, copy) for scores, copy in kept)
        assert len({scores.data_ptr() for scores, _ in kept}) == len(kept)
    assert draws


def test_a_kept_draw_keeps_its_final_scores_while_later_steps_run():
    """The draw of step t (its scores and probabilities) is read after step t + 1 and t + 2 have run."""
    steps = _steps(4)
    memo = {}
    chain = LogitsProcessorList([hf.TemperatureLogitsWarper(0.8), hf.MinPLogitsWarper(0.1)])
    first = fast_draw(None, steps[0], chain, torch.Generator().manual_seed(0), memo=memo, read_only=True)
    later = [fast_draw(None, rows, chain, torch.Generator().manual_seed(1), memo=memo, read_only=True)
             for rows in steps[1:]]
    alone = fast_draw(None, steps[0], chain, torch.Generator().manual_seed(0)).final_scores()
    assert torch.equal(first.final_scores(), alone)
    del later
    gc.collect()
    again = fast_draw(None, steps[2], chain, torch.Generator().manual_seed(2), memo=memo, read_only=True)
    assert torch.equal(first.final_scores(), alone)
    assert again.final_scores().data_ptr() != first.final_scores().data_ptr()


def test_an_invalid_row_is_still_explained_after_lent_steps():
    sampler = Sampler(fast=True, temperature=0.7, top_p=0.9, top_k=0, generator=torch.Generator().manual_seed(0))
    steps = _steps(4)
    ids = torch.zeros(6, 1, dtype=torch.long)
    for rows in steps[:3]:
        sampler(rows, ids)
    bad = steps[3].clone()
    bad[2, 5] = float("nan")
    with pytest.raises(ValueError, match="row 2"):
        sampler(bad, ids)
    assert sampler(steps[0], ids).shape == (6,)  # and the sampler goes on


def test_lend_like_reuses_only_a_fitting_buffer_and_only_once_its_owner_is_gone():
    memo = {}
    like = torch.zeros(3, 5)
    owner = FastState(like)
    first = lend_like(like, owner, memo, "probs")
    assert first.shape == (3, 5) and first.is_contiguous() and "probs" not in memo
    other = FastState(like)
    second = lend_like(like, other, memo, "probs")  # the first is still lent: a fresh one
    assert second.data_ptr() != first.data_ptr()
    del owner
    assert memo["probs"] is first
    third = lend_like(like, FastState(like), memo, "probs")
    assert third is first
    assert lend_like(torch.zeros(4, 5), FastState(like), memo, "probs").shape == (4, 5)
    assert lend_like(like.double(), FastState(like), {}, "probs").dtype == torch.float64
    assert lend_like(like, FastState(like), None, "probs").shape == (3, 5)  # no memo: fresh, nothing kept


@pytest.mark.parametrize("options", OPTIONS[:4], ids=[str(sorted(o)) for o in OPTIONS[:4]])
def test_scores_that_require_grad_and_inference_mode_steps_take_the_same_draws(options, monkeypatch):
    """Logits straight from a model without `torch.no_grad()` (they require grad: torch refuses `out=` there, so
    those steps compute out of place), and steps alternating in and out of `torch.inference_mode()` (a buffer
    made inside is not written outside): the tokens of a sampler that never lends."""
    steps = _steps(6)
    ids = torch.zeros(6, 1, dtype=torch.long)

    def run(sampler):
        tokens = []
        for number, rows in enumerate(steps):
            if number % 3 == 0:
                tokens.append(sampler(rows.clone().requires_grad_(), ids))
            elif number % 3 == 1:
                with torch.inference_mode():
                    tokens.append(sampler(rows, ids))
            else:
                tokens.append(sampler(rows, ids))
        return tokens

    lent = run(Sampler(fast=True, generator=torch.Generator().manual_seed(3), **options))
    _fresh_only(monkeypatch)
    fresh = run(Sampler(fast=True, generator=torch.Generator().manual_seed(3), **options))
    assert all(torch.equal(a, b) for a, b in zip(lent, fresh, strict=True))
