"""The CPU exact draw against `torch.multinomial` itself: the same tokens, the generator left in the same state."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hfbridge import accelerator_route
from hfbridge._step.run.exact_draw import _draw, _some_draw_zero, draw_one, softmax


def assert_same_draw(probs, seed, **options):
    mine, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    expected = torch.multinomial(probs, 1, generator=theirs).squeeze(1)
    before = probs.clone()
    got = draw_one(probs, mine, **options)
    assert torch.equal(got, expected)
    assert torch.equal(mine.get_state(), theirs.get_state())  # the next draws agree too
    assert torch.equal(probs, before)


def sparse(rows, vocab, keep, ties, seed):
    generator = torch.Generator().manual_seed(seed)
    probs = torch.rand(rows, vocab, generator=generator)
    if ties:
        probs = (probs * 4).ceil()  # many equal probabilities: the first index of the best ratio wins
    probs = probs * (torch.rand(rows, vocab, generator=generator) < keep)
    probs[:, 0] += (probs.sum(1) == 0).float()  # every row keeps a token
    return probs


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 6), vocab=st.integers(1, 400), keep=st.sampled_from([0.0, 0.01, 0.1, 0.25]),
       ties=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_the_draw_is_torch_multinomials(rows, vocab, keep, ties, seed):
    probs = sparse(rows, vocab, keep, ties, seed)
    assert_same_draw(probs, seed)
    assert_same_draw(probs / probs.sum(1, keepdim=True), seed + 1)


@pytest.mark.parametrize("kept", [1, 40, 3000])
def test_a_batch_of_large_rows_after_a_cut_takes_the_shortcut(kept):
    generator = torch.Generator().manual_seed(kept)
    scores = torch.randn(8, 50000, generator=generator) * 3
    scores[scores < scores.topk(kept, dim=-1).values[:, -1:]] = -torch.inf
    probs = torch.softmax(scores, -1)
    assert _draw(probs, torch.Generator().manual_seed(0), True) is not None  # not torch.multinomial's own
    for seed in range(5):
        assert_same_draw(probs, seed, softmax_output=True)


def test_the_default_generator_moves_as_torch_multinomials_does():
    probs = sparse(3, 5000, 0.01, False, 7)
    torch.manual_seed(11)
    got = draw_one(probs)
    after = torch.rand(4)
    torch.manual_seed(11)
    assert torch.equal(got, torch.multinomial(probs, 1).squeeze(1)) and torch.equal(torch.rand(4), after)


def test_dense_rows_fall_back_to_torch_multinomial():
    probs = torch.rand(4, 1000, generator=torch.Generator().manual_seed(0)) + 0.1
    assert _draw(probs, torch.Generator(), False) is None  # every token kept: nothing to gain
    assert_same_draw(probs, 3)
    with accelerator_route():  # what an accelerator runs: torch.multinomial itself
        assert_same_draw(sparse(2, 300, 0.1, False, 1), 4)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.5, "zero row"])
def test_invalid_probabilities_raise_torch_multinomials_error(bad):
    probs = sparse(3, 200, 0.1, False, 2)
    if bad == "zero row":
        probs[1] = 0.0
    else:
        probs[1, 3] = bad
    with pytest.raises(RuntimeError) as expected:
        torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    with pytest.raises(RuntimeError) as got:
        draw_one(probs, generator)
    assert str(got.value) == str(expected.value) and torch.equal(generator.get_state(), state)


def test_a_softmax_with_a_row_of_nothing_raises_as_before():
    scores = torch.randn(2, 3000)
    scores[1] = -torch.inf
    probs = softmax(scores)
    assert torch.equal(probs[0], torch.softmax(scores[0], -1)) and bool(probs[1].isnan().all())
    with pytest.raises(RuntimeError, match="probability tensor contains either `inf`, `nan` or element < 0"):
        draw_one(probs, torch.Generator(), softmax_output=True)


def test_a_draw_whose_low_53_bits_are_zero_is_found():
    raw = torch.randint(1, 2**62, (1000,), generator=torch.Generator().manual_seed(0))
    raw |= 1  # no zero 32-bit word in the low halves
    raw[raw >> 32 == 0] |= 1 << 40
    assert not _some_draw_zero(raw)
    raw[17] = 5 << 53  # u = 0: the low 53 bits are 0, the high ones not
    assert _some_draw_zero(raw)
    raw[17] = 1 << 32  # a zero low word only: u > 0
    assert not _some_draw_zero(raw)


def test_probabilities_that_carry_a_graph():
    probs = sparse(2, 3000, 0.01, False, 4).requires_grad_()
    assert_same_draw(probs, 5)


@pytest.mark.parametrize("vocab", [300, 700, 2500])
def test_large_batches_draw_in_turns_of_whole_rows(monkeypatch, vocab):
    import hfbridge._step.run.exact_draw as exact_draw

    monkeypatch.setattr(exact_draw, "_CHUNK", 1000)  # 3, 1 and 1 rows at a time
    monkeypatch.setattr(exact_draw, "_local", type(exact_draw._local)())  # fresh buffers of that size
    probs = sparse(7, vocab, 0.05, False, vocab)
    assert _draw(probs, torch.Generator().manual_seed(0)) is not None
    for seed in range(3):
        assert_same_draw(probs, seed)
