"""hfbridge.processors against llama.cpp's own sampler tests (tests/test-sampling.cpp), vector for vector.

llama.cpp's tester turns probabilities into logits (`log p`), applies the sampler, then a softmax over
the tokens left (`dist`) and compares probabilities to 1e-5. Where a test lists the probabilities of
the tokens left in another order, they are compared as sorted lists.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from hfbridge.processors import (
    DRYLogitsProcessor,
    DynamicTemperatureLogitsWarper,
    PresenceFrequencyPenaltyLogitsProcessor,
    TopNSigmaLogitsWarper,
    XTCLogitsWarper,
)


def logits(probs):
    return torch.tensor(probs, dtype=torch.float32).log()[None]  # [1, V], llama.cpp: logf(p)


def after_dist(scores):
    return scores.softmax(-1)[0]


# test_penalties(probs, last_tokens, expected, repeat_penalty, alpha_frequency, alpha_presence)
PENALTIES = [
    ([0.2] * 5, [0], [0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
    ([0.2] * 5, [0, 1, 2], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
    ([0.2] * 5, [0, 1, 2, 0, 0], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
    ([0.2] * 5, [0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0),
    ([0.2] * 5, [0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0),
    ([0.2] * 5, [0, 1, 2, 0, 0], [0.000000, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0),
]


@pytest.mark.parametrize("probs,last,expected,repeat,frequency,presence", PENALTIES)
def test_penalties(probs, last, expected, repeat, frequency, presence):
    ids = torch.tensor([last])
    # llama.cpp's sampler counts its last len(last_tokens) accepted tokens
    penalties = PresenceFrequencyPenaltyLogitsProcessor(presence, frequency, penalty_last_n=len(last),
                                                        repetition_penalty=repeat)
    got = after_dist(penalties(ids, logits(probs)))
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-5, rtol=0)
    # the same as HF's repetition penalty followed by presence / frequency alone
    hf = RepetitionPenaltyLogitsProcessor(repeat)(ids, logits(probs))
    alone = PresenceFrequencyPenaltyLogitsProcessor(presence, frequency, penalty_last_n=-1)(ids, hf)
    torch.testing.assert_close(after_dist(alone), got, atol=1e-6, rtol=0)


# test_dry(probs, last_tokens, expected, multiplier, base, allowed_length, penalty_last_n, breakers)
DRY = [
    ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, []),
    ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, [[3]]),
    ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, []),
    ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, []),
]


@pytest.mark.parametrize("probs,last,expected,multiplier,base,allowed,last_n,breakers", DRY)
def test_dry(probs, last, expected, multiplier, base, allowed, last_n, breakers):
    dry = DRYLogitsProcessor(multiplier, base, allowed, last_n, sequence_breakers=breakers)
    got = after_dist(dry(torch.tensor([last]), logits(probs)))
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-5, rtol=0)


# test_xtc(probs, expected, probability, threshold): no `dist` after it, the kept tokens' p unchanged
XTC = [
    ([0.4, 0.3, 0.2, 0.1], [0.1], 0.99, 0.09),
    ([0.4, 0.3, 0.2, 0.1], [0.2, 0.1], 0.99, 0.19),
    ([0.4, 0.3, 0.2, 0.1], [0.3, 0.2, 0.1], 0.99, 0.29),
    ([0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1], 0.99, 0.39),  # "XTC should not"
]


@pytest.mark.parametrize("probs,expected,probability,threshold", XTC)
def test_xtc(probs, expected, probability, threshold):
    generator = torch.Generator().manual_seed(0)  # its first number, 0.496, is < 0.99: the coin says apply
    warper = XTCLogitsWarper(threshold, probability, generator=generator)
    out = warper(None, logits(probs))[0]
    kept = sorted((p for p, s in zip(probs, out.tolist()) if s != -math.inf), reverse=True)
    assert kept == pytest.approx(expected, abs=1e-6)


# test_top_n_sigma(probs, expected, n)
@pytest.mark.parametrize("n,expected", [(1.0, [0.0, 0.0, 0.428571, 0.571429]), (3.0, [0.1, 0.2, 0.3, 0.4])])
def test_top_n_sigma(n, expected):
    got = after_dist(TopNSigmaLogitsWarper(n)(None, logits([0.1, 0.2, 0.3, 0.4])))
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-5, rtol=0)


def test_top_n_sigma_zero_is_refused_not_a_no_op():
    # llama.cpp reads n <= 0 as "off" (PR #13345); an option left out is hfbridge's "off"
    with pytest.raises(ValueError, match=r"^`n` must be > 0.0, got 0.0.$"):
        TopNSigmaLogitsWarper(0.0)


# test_temp_ext(probs, expected, temp, delta, exponent)
@pytest.mark.parametrize("temp,expected", [(1.0, [0.1, 0.2, 0.3, 0.4]), (0.0, [0.0, 0.0, 0.0, 1.0])])
def test_temp_ext(temp, expected):
    got = after_dist(DynamicTemperatureLogitsWarper(temp, 0.0, 1.0)(None, logits([0.1, 0.2, 0.3, 0.4])))
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-5, rtol=0)
