"""The host paths of top-nσ, dynamic temperature, mirostat 2, adaptive-p, XTC and the penalties, and smoothing's
fused form (CPU: few fused passes, the cut by
`torch.threshold` per row, in place on owned scores) against the plain references and the general path.

The general path (`accelerator_route()`, what an accelerator runs) keeps its arithmetic; the host path
sums in another order (top-nσ's squares by `vector_norm`) or takes the softmax's exponentials (dynamic
temperature's entropy, mirostat's and XTC's probabilities) or another formula (adaptive-p's transform as
`5 - (10 / w) e^2 / (w + e)`). Bounds, stated per test: kept sets equal to the
references' for every token farther than 1e-4 from the cut; dynamic temperature's values within a
relative 1e-5 of the general path's; the other values within 1e-5.
"""

from __future__ import annotations

import math
import warnings

import _samplers_reference as ref
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessorList

from hfbridge import accelerator_route
from hfbridge.processors import (
    AdaptivePLogitsWarper,
    DynamicTemperatureLogitsWarper,
    MirostatLogitsWarper,
    PresenceFrequencyPenaltyLogitsProcessor,
    SmoothingLogitsWarper,
    TopNSigmaLogitsWarper,
    XTCLogitsWarper,
)
from hfbridge.processors._cpu_side import owned_scores

WIDE = 2304  # at least the width where the cut runs per row (2048)


def realistic(rows, vocab, seed, scale=1.0, offset=0.0):
    generator = torch.Generator().manual_seed(seed)
    rank = torch.arange(1, vocab + 1, dtype=torch.float64)
    order = torch.argsort(torch.rand(rows, vocab, generator=generator), dim=-1)
    values = (-1.1 * rank.log())[order] + 0.1 * torch.randn(rows, vocab, generator=generator, dtype=torch.float64)
    return (values * scale + offset).float()  # [B, V]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.sampled_from([0.1, 0.5, 1.0, 2.0, 3.0]),
       scale=st.sampled_from([0.3, 1.0, 4.0]), offset=st.sampled_from([0.0, -30.0, 25.0]))
def test_top_n_sigma_host_path_matches_the_reference(seed, n, scale, offset):
    scores = realistic(1, WIDE, seed, scale, offset)
    values = scores[0].tolist()
    expected, floor = ref.top_n_sigma(values, n)
    assume(all(abs(v - floor) > 1e-4 * max(1.0, abs(floor)) for v in values))
    assert TopNSigmaLogitsWarper(n)(None, scores)[0].tolist() == expected


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), temperature=st.sampled_from([0.3, 0.8, 1.5]),
       spread=st.sampled_from([0.0, 0.2, 0.5]), exponent=st.sampled_from([0.5, 1.0, 2.0]),
       scale=st.sampled_from([0.3, 1.0, 4.0]))
def test_dynamic_temperature_host_path_matches_the_general_path_and_the_reference(seed, temperature, spread,
                                                                                 exponent, scale):
    scores = realistic(2, WIDE, seed, scale)
    warper = DynamicTemperatureLogitsWarper(temperature, spread, exponent)
    got = warper(None, scores)
    with accelerator_route():
        general = warper(None, scores)
    # the entropy from the softmax's exponentials and one dot product: the temperature within 1e-5
    torch.testing.assert_close(got, general, rtol=1e-5, atol=0)
    expected = ref.dynamic_temperature(scores[0].tolist(), temperature=temperature, spread=spread, exponent=exponent)
    torch.testing.assert_close(got[0], torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=0)


def test_mirostat_host_path_keeps_the_reference_set_and_follows_mu():
    tau, eta = [3.0, 5.0, 4.0], [0.1, 0.5, 0.3]
    warper = MirostatLogitsWarper(tau, eta)
    general = MirostatLogitsWarper(tau, eta)
    ids = torch.tensor([[1], [2], [3]])
    mus = [2 * t for t in tau]
    for step in range(8):
        scores = realistic(3, WIDE, step, scale=1.5)
        out = warper(ids, scores)
        with accelerator_route():
            general_out = general(ids, scores)
        torch.testing.assert_close(warper.mu, torch.tensor(mus), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(warper.mu, general.mu, rtol=1e-6, atol=1e-6)
        chosen = []
        for row in range(3):
            kept, renormalised = ref.mirostat_keep(scores[row].tolist(), mus[row])
            cut = 2.0 ** -mus[row]
            near = {i for i, p in enumerate(ref.softmax(scores[row].tolist())) if abs(p / cut - 1) < 1e-4}
            got = set(torch.isfinite(out[row]).nonzero().flatten().tolist())
            assert got ^ set(kept) <= near and got == set(torch.isfinite(general_out[row]).nonzero().flatten().tolist())
            assert out[row][list(got)].tolist() == scores[row][list(got)].tolist()  # kept scores untouched
            token = kept[len(kept) // 2]
            chosen.append(token)
            mus[row] -= eta[row] * (-math.log2(renormalised[token]) - tau[row])
        ids = torch.cat([ids, torch.tensor(chosen)[:, None]], dim=1)


SAMPLERS = [
    (TopNSigmaLogitsWarper, dict(n=[0.5, 1.0, 2.0, 1.5])),
    (TopNSigmaLogitsWarper, dict(n=1.0, filter_value=-50.0, min_tokens_to_keep=5)),
    (DynamicTemperatureLogitsWarper, dict(temperature=[0.5, 1.0, 1.5, 0.8], range=[0.0, 0.5, 1.0, 0.3],
                                          exponent=[1.0, 2.0, 0.5, 1.0])),
    (MirostatLogitsWarper, dict(tau=[1.0, 3.0, 5.0, 2.0], eta=[0.1, 0.2, 0.3, 0.4])),
    (AdaptivePLogitsWarper, dict(target=[0.1, 0.3, 0.5, 0.9], decay=[0.9, 0.5, 0.0, 0.99])),
    (XTCLogitsWarper, dict(threshold=[0.05, 0.1, 0.2, 0.01], probability=1.0, min_tokens_to_keep=2)),
    (SmoothingLogitsWarper, dict(factor=[0.3, 0.1, 1.0, 0.5], curve=[2.0, 3.0, 1.5, 4.0])),
    (PresenceFrequencyPenaltyLogitsProcessor, dict(presence_penalty=[0.0, 0.5, 1.0, 0.2], frequency_penalty=[
        1.0, 0.0, 0.2, 0.3], penalty_last_n=[-1, 3, 0, 5], repetition_penalty=[1.0, 1.2, 2.0, 1.1])),
]
IDS = ["top_n_sigma", "top_n_sigma_filter_value", "dynamic_temperature", "mirostat", "adaptive_p", "xtc", "smoothing",
       "penalties"]
IN_PLACE = (TopNSigmaLogitsWarper, MirostatLogitsWarper, XTCLogitsWarper, SmoothingLogitsWarper,
            PresenceFrequencyPenaltyLogitsProcessor)  # write into owned scores on either path


def row_alone(params, row):
    return {name: value[row] if isinstance(value, list) else value for name, value in params.items()}


def odd_rows(dtype=torch.float32):
    scores = realistic(4, WIDE, 3).to(dtype)
    scores[1, :100] = -torch.inf  # removed by an earlier processor: the general path
    return scores


@pytest.mark.parametrize("cls,params", SAMPLERS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_called_by_transformers_the_input_stays_and_owned_scores_are_written_in_place(cls, params, dtype):
    ids = torch.randint(0, WIDE, (4, 9))
    for scores, host in ((realistic(4, WIDE, 1).to(dtype), True), (odd_rows(dtype), False)):
        before = scores.clone()
        out = LogitsProcessorList([cls(**params)])(ids, scores)
        assert torch.equal(scores, before) and out is not scores
        mine = scores.clone()
        with owned_scores():
            owned = cls(**params)(ids, mine)
        assert torch.equal(owned, out)
        if host or cls in IN_PLACE:  # the host path writes into owned scores
            assert owned is mine


@pytest.mark.parametrize("cls,params", SAMPLERS, ids=IDS)
def test_rows_with_nan_inf_or_nothing_left_give_the_general_paths_answer(cls, params):
    ids = torch.randint(0, WIDE, (4, 9))
    scores = realistic(4, WIDE, 2)
    scores[0, 5] = torch.nan
    scores[1, 7] = torch.inf
    scores[2] = -torch.inf
    scores[3, ::3] = -torch.inf
    got = cls(**params)(ids, scores)
    with accelerator_route():
        general = cls(**params)(ids, scores)
    torch.testing.assert_close(got, general, rtol=1e-5, atol=0, equal_nan=True)


@pytest.mark.parametrize("cls,params", SAMPLERS, ids=IDS)
def test_per_row_values_equal_each_row_alone_on_the_host_path(cls, params):
    ids = torch.randint(0, WIDE, (4, 9))
    scores = odd_rows()
    batched = cls(**params)(ids, scores)
    for row in range(4):
        alone = cls(**row_alone(params, row))(ids[row:row + 1], scores[row:row + 1])
        torch.testing.assert_close(alone[0], batched[row])


@pytest.mark.parametrize("cls,params", SAMPLERS, ids=IDS)
@pytest.mark.parametrize("vocab", [2, 17, WIDE])
def test_one_row_and_narrow_rows(cls, params, vocab):
    ids = torch.zeros(4, 3, dtype=torch.long)
    scores = realistic(4, vocab, 5)
    got = cls(**params)(ids, scores)
    with accelerator_route():
        general = cls(**params)(ids, scores)
    torch.testing.assert_close(got, general, rtol=1e-5, atol=1e-5)
    one = cls(**row_alone(params, 2))(ids[2:3], scores[2:3])
    torch.testing.assert_close(one[0], got[2])


def test_adaptive_p_host_path_follows_the_general_path_over_steps():
    params = dict(target=[0.1, 0.3, 0.6], decay=[0.9, 0.5, 0.99])
    host, general = AdaptivePLogitsWarper(**params), AdaptivePLogitsWarper(**params)
    ids = torch.tensor([[1], [2], [3]])
    for step in range(6):
        scores = realistic(3, WIDE, 10 + step, scale=0.5)
        got = host(ids, scores)
        with accelerator_route():
            expected = general(ids, scores)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(host.state, general.state, rtol=1e-6, atol=1e-6)
        ids = torch.cat([ids, got.argmax(-1, keepdim=True)], dim=1)


@pytest.mark.parametrize("cls,params", SAMPLERS, ids=IDS)
def test_scores_that_carry_a_graph_take_the_general_path(cls, params):
    ids = torch.randint(0, WIDE, (4, 9))
    scores = realistic(4, WIDE, 6).requires_grad_()
    got = cls(**params)(ids, scores)
    with accelerator_route():
        general = cls(**params)(ids, scores)
    assert torch.equal(got, general)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), factor=st.sampled_from([0.05, 0.3, 2.0]), curve=st.sampled_from([1.5, 2.0, 4.0]),
       scale=st.sampled_from([0.5, 3.0, 10.0]))
def test_smoothing_fused_multiply_adds_stay_within_two_roundings_of_the_exact_value(seed, factor, curve, scale):
    # d^2 (s f d - k f) + best by two addcmul calls: each rounds once where the separate products rounded
    # twice; against the float64 value the error stays under 4 float32 ulps of the terms' size
    scores = realistic(2, 300, seed, scale, offset=3.0)
    got = SmoothingLogitsWarper(factor, curve)(None, scores).double()
    x = scores.double()
    best = x.amax(-1, keepdim=True)
    d = x - best
    term = d.square() * ((curve - 1) / 2 * factor * d - (3 - curve) / 2 * factor)
    bound = 4 * torch.finfo(torch.float32).eps * (best.abs() + term.abs() + d.abs())
    assert bool(((got - (term + best)).abs() <= bound).all())


def test_the_penalties_counting_buffer_stays_zero_between_calls():
    from hfbridge.processors import _cpu_side

    params = dict(presence_penalty=0.5, frequency_penalty=0.25, penalty_last_n=-1, repetition_penalty=1.3)
    host = PresenceFrequencyPenaltyLogitsProcessor(**params)
    scores = realistic(2, WIDE, 8)
    for length in (2500, 4000, 2100):  # windows past the NumPy path's size, other ones each call
        ids = torch.randint(0, 50, (2, length))
        with accelerator_route():
            expected = PresenceFrequencyPenaltyLogitsProcessor(**params)(ids, scores)
        assert torch.equal(host(ids, scores), expected)
        assert not bool(_cpu_side._SCRATCH.zeros.any())  # no count of an earlier call may remain
    bad = ids.clone()
    bad[0, 7] = WIDE + 5
    with pytest.raises((IndexError, RuntimeError)):
        host(bad, scores)  # an id outside the vocabulary
    assert torch.equal(host(ids, scores), expected)  # a fresh buffer after the error


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 4), vocab=st.integers(2, 60), length=st.integers(1, 40) | st.integers(120, 200),
       data=st.data())
def test_the_penalties_numpy_path_equals_the_batched_path(rows, vocab, length, data):
    """Short CPU windows are counted on the host (one row's short window by `Counter`, else a NumPy sort): the
    same bits as the batched path, per-row values and windows."""
    def value(options):
        return data.draw(st.one_of(st.sampled_from(options), st.lists(st.sampled_from(options), min_size=rows,
                                                                      max_size=rows)))
    params = dict(presence_penalty=value([0.0, 0.5, -1.25]), frequency_penalty=value([0.0, 0.3, 2.0]),
                  repetition_penalty=value([1.0, 1.3, 0.7]), penalty_last_n=value([-1, 0, 1, 3, 64]))
    ids = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=length, max_size=length),
                                          min_size=rows, max_size=rows)))
    values = data.draw(st.lists(st.sampled_from([0.0, -0.0, 1.5, -2.25, 7.0, float("inf"), float("-inf"),
                                                 float("nan")]) | st.floats(-20, 20, width=32),
                                min_size=rows * vocab, max_size=rows * vocab))
    scores = torch.tensor(values, dtype=data.draw(st.sampled_from([torch.float32, torch.float64]))).view(rows, vocab)
    before = scores.clone()
    processor = PresenceFrequencyPenaltyLogitsProcessor(**params)
    host = processor(ids, scores)
    with accelerator_route():
        batched = processor(ids, scores)
    torch.testing.assert_close(scores, before, rtol=0, atol=0, equal_nan=True)  # the caller's scores untouched
    torch.testing.assert_close(host, batched, rtol=0, atol=0, equal_nan=True)
    with owned_scores():  # written in place into the step's own copy: the same values
        torch.testing.assert_close(processor(ids, scores.clone()), host, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_penalties_one_row_table_overflows_as_the_batched_path(dtype):
    """One row's `count * frequency + presence` comes from a table made once per dtype: huge values overflow to
    the same infinities (and NaN from inf - inf) as the batched path's, without a warning."""
    ids = torch.tensor([[1, 2, 2, 3, 3, 3, 0, 4]])
    scores = torch.tensor([[3.0e38, -3.0e38, 1.0, float("inf"), -2.0]], dtype=dtype)
    for params in (dict(presence_penalty=3.0e38, frequency_penalty=3.0e38), dict(presence_penalty=-3.0e38),
                   dict(frequency_penalty=1.0e308, repetition_penalty=1e-30), dict(repetition_penalty=3.0e38)):
        processor = PresenceFrequencyPenaltyLogitsProcessor(penalty_last_n=-1, **params)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            host = processor(ids, scores)
            with accelerator_route():
                batched = processor(ids, scores)
        torch.testing.assert_close(host, batched, rtol=0, atol=0, equal_nan=True)


def test_the_penalties_numpy_path_refuses_ids_outside_the_vocabulary():
    processor = PresenceFrequencyPenaltyLogitsProcessor(0.5, 0.5, penalty_last_n=-1)
    for bad in (9, -1):
        for dtype in (torch.int64, torch.int32):
            with pytest.raises(IndexError, match=f"token id {bad}, outside the vocabulary of the scores"):
                processor(torch.tensor([[1, bad, 2], [0, 1, 2]], dtype=dtype), torch.zeros(2, 9))
            for length in (3, 300):  # one row: counted by `Counter`, or sorted
                ids = torch.ones(1, length, dtype=dtype)
                ids[0, length // 2] = bad
                with pytest.raises(IndexError, match=f"token id {bad}, outside the vocabulary of the scores"):
                    processor(ids, torch.zeros(1, 9))


@pytest.mark.parametrize("vocab", [40, 1000, WIDE])
def test_dynamic_temperature_row_equals_itself_with_removed_columns_appended(vocab):
    # vLLM's batches pad rows with a -inf column: the host path must not tell the difference, bit for bit
    scores = realistic(6, vocab, 9) * 3
    scores[2, 5] = -torch.inf
    padded = torch.cat([scores, torch.full((6, 3), -torch.inf)], dim=1)
    warper = DynamicTemperatureLogitsWarper(0.9, 0.5)
    assert torch.equal(warper(None, padded)[:, :vocab], warper(None, scores))


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), dtype=st.sampled_from([torch.float32, torch.float64]),
       value=st.sampled_from([-math.inf, -50.0]), owned=st.booleans())
def test_the_per_row_cut_keeps_exactly_the_scores_at_or_above_the_floor(seed, dtype, value, owned):
    from hfbridge.processors._rows import cut_below

    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(3, WIDE, generator=generator, dtype=dtype).round(decimals=1)  # many ties with the floor
    scores[0, :4] = torch.tensor([math.nan, -math.inf, math.inf, -0.0], dtype=dtype)
    floor = scores[:, 7:8].clone()  # a floor equal to one of the row's own values
    expected = torch.where(scores >= floor, scores, torch.tensor(value, dtype=dtype))
    expected[0, 0] = math.nan  # a NaN score stays NaN
    mine = scores.clone()
    if owned:
        with owned_scores():
            got = cut_below(mine, floor, value)
        assert got is mine
    else:
        got = cut_below(mine, floor, value)
        assert got is not mine
        torch.testing.assert_close(mine, scores, rtol=0, atol=0, equal_nan=True)  # the input untouched
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    if floor[0, 0] <= 0:  # -0.0 kept as it is (an added 0.0 would have made it +0.0)
        assert math.copysign(1.0, got[0, 3].item()) == -1.0
