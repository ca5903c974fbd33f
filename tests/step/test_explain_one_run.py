"""`Sampler.explain` is `Sampler.step` recorded: one run, so it cannot draw or step differently.

Each case compares an explained step with the same step unrecorded (same options, same seed): every processor is
called as often as in the step (a stateful one takes exactly one step), the generator is left in the same state
(nothing drawn twice or from another route), and the recorded scores are the ones the step chose from.
"""

from __future__ import annotations

import pytest
import torch
from transformers import TopPLogitsWarper

from hfbridge import Sampler

G = torch.Generator

CASES = {
    "exact": dict(temperature=0.7, top_p=0.9),
    "fast": dict(temperature=0.7, top_p=0.9, fast=True),
    "greedy": dict(do_sample=False, repetition_penalty=1.3),
    "fast per-row groups": dict(temperature=[0.5, 1.0, 0.0, 1.5], top_p=[0.9, 0.8, 1.0, 0.95], fast=True),
    "exact per-row groups": dict(temperature=[0.5, 1.0, 0.0, 1.5], top_p=[0.9, 0.8, 1.0, 0.95]),
    "fast xtc": dict(temperature=0.8, xtc_threshold=0.05, xtc_probability=0.5, top_k=0, fast=True,
                     min_p=[0.05, 0.1, 0.05, 0.1]),
}


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = G().manual_seed(seed)
    return torch.randn(4, 40, generator=generator) * 3, torch.randint(0, 40, (4, 6), generator=generator)


class _Counting:
    """A processor of yours: counts its calls and the rows it saw."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.rows.append(scores.shape[0])
        return scores + 0.25 * torch.arange(scores.shape[1], dtype=scores.dtype)


def _counting_hf(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """HF's own `TopPLogitsWarper.__call__`, still run, counted (the fast path fuses it: no call at all)."""
    calls: list[int] = []
    original = TopPLogitsWarper.__call__

    def counted(self, input_ids, scores):  # type: ignore[no-untyped-def]
        calls.append(scores.shape[0])
        return original(self, input_ids, scores)

    monkeypatch.setattr(TopPLogitsWarper, "__call__", counted)
    return calls


@pytest.mark.parametrize("generators", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_explain_runs_the_step_once(case, generators, monkeypatch):
    if generators and "xtc" in case:
        pytest.skip("XTC draws its coins from one generator")
    hf_calls = _counting_hf(monkeypatch)
    x, ids = _inputs()

    def run(explained: bool) -> tuple[torch.Tensor, list, list, _Counting, Sampler, list]:
        generator = [G().manual_seed(5 + row) for row in range(4)] if generators else G().manual_seed(5)
        yours = _Counting()
        sampler = Sampler(processors=[yours], generator=generator, mirostat=2, mirostat_tau=3.0, **CASES[case])
        hf_calls.clear()
        if explained:
            trace, tokens = sampler.explain(ids, x)
        else:
            trace, tokens = [], sampler.next_tokens(ids, x, check=True)
        states = [g.get_state() for g in (generator if generators else [generator])]
        return tokens, trace, states, yours, sampler, list(hf_calls)

    tokens, _, states, yours, stepped, hf = run(False)
    got, trace, got_states, got_yours, explained, got_hf = run(True)
    assert got.tolist() == tokens.tolist()
    assert got_yours.rows == yours.rows  # your processor: called as in the step, on the same rows
    assert got_hf == hf  # HF's processors too: none run a second time, fused ones not run at all
    assert all(torch.equal(a, b) for a, b in zip(got_states, states))  # the same random numbers drawn
    mu, stepped_mu = ([p.mu for p, _ in sampler._stateful()] for sampler in (explained, stepped))
    assert len(mu) == len(stepped_mu) == (0 if case == "greedy" else len(mu)) and (case == "greedy" or mu)
    assert all(torch.equal(a, b) for a, b in zip(mu, stepped_mu))  # mirostat took one step, as in the step
    assert [p for p, _ in trace] == list(explained.processors)  # one record per processor of the chain, in order
    final = trace[-1][1]  # [N, V] what the step chose from
    assert all(final[row, token] > float("-inf") for row, token in enumerate(got.tolist()))


def test_recorded_scores_are_what_the_step_chose_from():
    """Exact: the step's own processed scores; fast: the fused path's final scores (not exact mode's rerun)."""
    x, ids = _inputs(1)
    exact = Sampler(temperature=0.7, top_p=0.9, top_k=12, generator=G().manual_seed(0))
    result = exact.step(ids, x)
    trace, _ = Sampler(temperature=0.7, top_p=0.9, top_k=12, generator=G().manual_seed(0)).explain(ids, x)
    assert torch.equal(trace[-1][1], result.scores)
    fast = Sampler(temperature=0.7, top_p=0.9, top_k=12, fast=True, generator=G().manual_seed(0))
    fast.next_tokens(ids, x, check=False)
    drawn = fast._last_fast[0].final_scores() if fast._last_fast is not None else None
    trace, _ = Sampler(temperature=0.7, top_p=0.9, top_k=12, fast=True, generator=G().manual_seed(0)).explain(ids, x)
    if drawn is not None:
        assert torch.equal(trace[-1][1], drawn)
    names = [type(p).__name__ for p, _ in trace]
    assert names == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"]


def test_record_is_a_parameter_of_the_step():
    x, ids = _inputs(2)
    seen: list[tuple[str, tuple[int, ...]]] = []
    sampler = Sampler(temperature=0.5, top_k=3, fast=True, generator=G().manual_seed(1))
    result = sampler.step(ids, x, record=lambda processor, scores: seen.append((type(processor).__name__,
                                                                                tuple(scores.shape))))
    assert seen == [("TemperatureLogitsWarper", (4, 40)), ("TopKLogitsWarper", (4, 40))]
    unrecorded = Sampler(temperature=0.5, top_k=3, fast=True, generator=G().manual_seed(1)).step(ids, x)
    assert torch.equal(result.tokens, unrecorded.tokens)


@pytest.mark.parametrize("fast", [False, True])
def test_explain_raises_the_steps_error_for_a_row_with_nothing_to_choose(fast):
    x, ids = _inputs(3)
    x[2] = float("-inf")
    with pytest.raises(ValueError) as stepped:
        Sampler(temperature=0.7, fast=fast).next_tokens(ids, x, check=True)
    with pytest.raises(ValueError) as explained:
        Sampler(temperature=0.7, fast=fast).explain(ids, x)
    assert str(explained.value) == str(stepped.value)
