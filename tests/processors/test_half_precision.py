"""Samplers on float16 scores (a model run in half precision, the processors called on its logits as they are)."""

import math

import pytest
import torch

from hfbridge.processors import DynamicTemperatureLogitsWarper, MirostatLogitsWarper, TopNSigmaLogitsWarper

SCORES = torch.tensor([[2.0, 1.5, -1.0, float("-inf"), 0.25, -3.0], [0.5, 0.5, 0.5, 0.0, -0.5, 4.0]])


def _plain_top_n_sigma(row, n):
    """Keep scores >= best - n * std of the finite scores (population std), by hand in float64."""
    finite = [v for v in row if v > -math.inf]
    mean = sum(finite) / len(finite)
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / len(finite))
    return [v >= max(finite) - n * std for v in row]


def test_top_n_sigma_on_float16():
    out = TopNSigmaLogitsWarper(1.0)(None, SCORES.half())
    assert out.dtype == torch.float16
    assert torch.isfinite(out).tolist() == [_plain_top_n_sigma(row, 1.0) for row in SCORES.tolist()]
    assert torch.equal(out[torch.isfinite(out)], SCORES.half()[torch.isfinite(out)])  # kept scores unchanged


def _plain_dynamic_temperature(row, temperature, spread):
    """llama.cpp's entropy-scaled temperature, by hand in float64 (exponent 1)."""
    finite = [v for v in row if v > -math.inf]
    best = max(finite)
    weights = [math.exp(v - best) for v in finite]
    total = sum(weights)
    entropy = -sum(w / total * math.log(w / total) for w in weights)
    chosen = (temperature - spread) + 2 * spread * entropy / math.log(len(finite))
    return [v / chosen for v in row]


def test_dynamic_temperature_on_float16():
    out = DynamicTemperatureLogitsWarper(1.0, 0.5)(None, SCORES.half())
    assert out.dtype == torch.float16
    for got, row in zip(out.tolist(), SCORES.tolist()):
        expected = _plain_dynamic_temperature(row, 1.0, 0.5)
        assert got == pytest.approx(expected, rel=2e-3)


def test_mirostat_on_float16():
    out = MirostatLogitsWarper(tau=1.0)(torch.tensor([[0], [0]]), SCORES.half())  # mu = 2 bits: p >= 1/4
    assert out.dtype == torch.float16
    probs = torch.softmax(SCORES.double(), -1)
    assert torch.isfinite(out).tolist() == (probs >= 0.25).tolist()
