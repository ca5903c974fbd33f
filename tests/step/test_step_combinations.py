"""Where two features meet: per-row values, generator lists, `fast=True`, the community samplers, guidance.

Each test is one kind of defect at its root, with the expected result from HF's processors, the
processor class alone, or a row run alone with scalar values.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GenerationConfig
from transformers.generation import logits_process as hf

from hfbridge import Sampler, explain_step, sample_step
from hfbridge.processors import DynamicTemperatureLogitsWarper, MirostatLogitsWarper

V = 40


def G(seed):
    return torch.Generator().manual_seed(seed)


def logits(rows, seed=0):
    return torch.randn(rows, V, generator=G(seed)) * 3


def ids_of(rows, seed=1, length=5):
    return torch.randint(0, V, (rows, length), generator=G(seed))


def alone(x, ids, row, options, generator_seed, **more):
    """Row `row` run alone, with its scalar values and its own generator."""
    scalars = {name: value[row] if isinstance(value, list) else value for name, value in options.items()}
    extra = {name: value[row:row + 1] if isinstance(value, torch.Tensor) else value for name, value in more.items()}
    return sample_step(x[row:row + 1], ids[row:row + 1], generator=G(generator_seed + row), **scalars, **extra)


def test_per_row_top_n_sigma_with_fast_and_generator_list_equals_each_row_alone():
    x, ids = logits(3), ids_of(3)
    options = dict(do_sample=True, top_n_sigma=[1.0, 2.0, 3.0], fast=True)
    got = sample_step(x, ids, generator=[G(10), G(11), G(12)], **options)
    assert got.tolist() == [int(alone(x, ids, row, options, 10)) for row in range(3)]


def test_mirostat_with_generator_list_and_fast_follows_each_row_alone_over_steps():
    rows, steps = 5, 8
    x_steps = [logits(rows, seed=s) for s in range(steps)]
    options = dict(mirostat=2, mirostat_tau=1.5, mirostat_eta=1.0, fast=True)
    batch = Sampler(generator=[G(20 + r) for r in range(rows)], **options)
    singles = [Sampler(generator=G(20 + r), **options) for r in range(rows)]
    ids = ids_of(rows)
    for x in x_steps:
        got = batch(x, ids)
        expected = torch.cat([singles[r](x[r:r + 1], ids[r:r + 1]) for r in range(rows)])
        assert torch.equal(got, expected)
        ids = torch.cat([ids, got[:, None]], dim=1)


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("per_row", ["values", "generators"])
def test_guidance_with_per_row_groups_calls_the_unconditional_once_per_step_on_every_row(fast, per_row):
    rows = 3
    calls = []
    unconditional_logits = logits(rows, seed=7)

    def unconditional(input_ids):
        calls.append(tuple(input_ids.shape))
        return unconditional_logits[:input_ids.shape[0]]

    options = dict(guidance_scale=2.0, fast=fast, do_sample=True)
    if per_row == "values":
        options["top_k"] = [3, 10, 20]
        generator = G(3)
    else:
        generator = [G(3), G(4), G(5)]
    sampler = Sampler(unconditional=unconditional, generator=generator, **options)
    ids = ids_of(rows)
    for step in range(3):
        tokens = sampler(logits(rows, seed=step), ids)
        ids = torch.cat([ids, tokens[:, None]], dim=1)
    assert calls == [(3, 5), (3, 6), (3, 7)]  # HF's guidance: one call per step, every row


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("generators", [False, True])
def test_explain_step_records_the_token_sample_step_returns(fast, generators):
    x, ids = logits(4), ids_of(4)
    options = dict(temperature=[0.5, 1.0, 0.0, 1.5], top_k=20, top_p=[0.9, 0.8, 1.0, 0.95], fast=fast,
                   mirostat=2, repetition_penalty=[1.2, 1.0, 1.0, 1.3])

    def generator():
        return [G(30 + r) for r in range(4)] if generators else G(30)

    returned = sample_step(x, ids, generator=generator(), **options)
    recorded = [explain_step(x, ids, row=row, generator=generator(), **options).token for row in range(4)]
    assert recorded == returned.tolist()


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("per_row", [dict(temperature=[0.7, 1.0, 0.7, 1.3]),  # one fast draw on CPU
                                     dict(top_p=[0.9, 0.95, 0.9, 0.95]),  # the same
                                     # groups drawn one after another, each after its own XTC coins
                                     dict(min_p=[0.05, 0.1, 0.05, 0.1]), dict(xtc_threshold=[0.05, 0.1, 0.1, 0.05])])
def test_explain_step_with_xtc_records_the_token(fast, per_row):
    options = dict(temperature=0.8, xtc_threshold=0.05, xtc_probability=0.5, top_k=0, fast=fast)
    options.update(per_row)
    for seed in range(12):
        x, ids = logits(4, seed=seed), ids_of(4)
        returned = sample_step(x, ids, generator=G(seed), **options).tolist()
        for row in range(4):
            assert explain_step(x, ids, row=row, generator=G(seed), **options).token == returned[row]


@st.composite
def _explained(draw):
    """Options for `explain_step` against `sample_step`: per-row groups, XTC, fast or exact, seeded generators."""
    rows = draw(st.integers(2, 4))

    def per_row_or_one(values):
        return draw(st.one_of(st.sampled_from(values), st.lists(st.sampled_from(values), min_size=rows,
                                                                 max_size=rows)))

    options = {}
    for name, values in [("temperature", [0.0, 0.5, 1.0, 1.5]), ("top_k", [0, 3, 10]), ("top_p", [0.5, 0.9, 1.0]),
                         ("min_p", [0.0, 0.05, 0.2]), ("repetition_penalty", [1.0, 1.3])]:
        if draw(st.booleans()):
            options[name] = per_row_or_one(values)
    xtc = draw(st.booleans())
    if xtc:
        options["xtc_threshold"] = per_row_or_one([0.05, 0.1, 0.3])
        options["xtc_probability"] = per_row_or_one([0.0, 0.5, 1.0])
    # XTC draws its coins from one generator; without it, one generator per row may be drawn too
    per_row_generators = not xtc and draw(st.booleans())
    return rows, options, draw(st.booleans()), per_row_generators, draw(st.integers(0, 1000))


@settings(max_examples=30, deadline=None)
@given(_explained())
def test_explain_step_records_the_token_sample_step_returns_for_drawn_combinations(case):
    rows, options, fast, per_row_generators, seed = case
    x, ids = logits(rows, seed=seed), ids_of(rows, seed=seed + 1)

    def generator():
        return [G(seed + r) for r in range(rows)] if per_row_generators else G(seed)

    returned = sample_step(x, ids, do_sample=True, fast=fast, generator=generator(), **options).tolist()
    for row in range(rows):
        trace = explain_step(x, ids, row=row, do_sample=True, fast=fast, generator=generator(), **options)
        assert trace.token == returned[row], (row, options, fast, per_row_generators)
        assert trace.stages[-1].scores[trace.token] > float("-inf")  # the recording holds the token drawn


def test_per_row_temperature_reaches_dynamic_temperature():
    x = logits(2)
    got = Sampler(temperature=[0.5, 1.5], dynatemp_range=0.3).process(ids_of(2), x.clone())
    for row, temperature in enumerate([0.5, 1.5]):
        expected = DynamicTemperatureLogitsWarper(temperature, 0.3)(None, x[row:row + 1].clone())
        assert torch.equal(got[row:row + 1], expected)


def test_per_row_repetition_penalty_with_penalty_last_n_is_per_row():
    x, ids = logits(2), torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]])
    got = Sampler(repetition_penalty=[1.5, 1.0], penalty_last_n=3).process(ids, x.clone())
    expected = x.clone()
    for token in (3, 4, 5):  # the last 3 tokens of row 0, HF's rule: negative scores times, positive ones over
        score = expected[0, token]
        expected[0, token] = score * 1.5 if score < 0 else score / 1.5
    assert torch.equal(got, expected)


def test_a_greedy_row_skips_every_warper():
    x = torch.tensor([[5.0, 4.8, 0.0, -1.0]] * 2)
    options = dict(top_k=0, xtc_threshold=0.05, xtc_probability=1.0)
    got = sample_step(x, temperature=[0.0, 1.0], generator=G(1), **options)
    assert got[0] == 0  # row 0: greedy, its argmax
    assert got[1] == sample_step(x[1:], temperature=1.0, generator=G(1), **options)[0]
    assert got[1] != 0  # XTC removed the top choice of the sampled row


def test_sample_step_with_mirostat_keeps_nothing_between_calls():
    x, ids = logits(2), ids_of(2, length=6)
    sample_step(x, ids[:, :-1], mirostat=2, mirostat_tau=1.0, generator=G(0))  # a call the next one extends
    got = sample_step(x, ids, mirostat=2, mirostat_tau=1.0, generator=G(5))
    scores = MirostatLogitsWarper(tau=1.0)(ids, x.clone())  # a fresh state: mu = 2 tau
    expected = torch.multinomial(torch.softmax(scores, -1), 1, generator=G(5)).squeeze(1)  # HF's draw
    assert torch.equal(got, expected)


@pytest.mark.parametrize("options, message", [
    (dict(dry_multiplier=1.0, dry_base=[1.5, 2.0], dry_sequence_breakers=[]),
     "`dry_base` has 2 values, one per row, but the step has 3 rows; pass one value per row, or a single number "
     "for every row."),
    (dict(top_n_sigma=[1.0, float("nan"), 1.0]), "`top_n_sigma[1]` (row 1) must be a finite number, got nan."),
    (dict(xtc_probability=[0.5, 2.0, 0.5]), "`xtc_probability[1]` (row 1) must be <= 1.0, got 2.0."),
    (dict(top_k=[1, 2.5, 3]), "`top_k[1]` (row 1) must be an int, got float 2.5."),
    (dict(mirostat=[2, 2, 2]), "`mirostat` must be an int (0 = off, 1 = mirostat 1.0, 2 = mirostat 2.0), got list [2, 2, 2]."),
    (dict(temperature=False), "`temperature` must be a number, got bool False."),  # not read as 0 (greedy)
    (dict(temperature=np.array([[0.5, 1.0, 1.0]])), "`temperature[0]` (row 0) must be a number, got list [0.5, 1.0, 1.0]."),
])
def test_per_row_values_have_one_parser_and_one_message_style(options, message):
    with pytest.raises((TypeError, ValueError)) as error:
        sample_step(logits(3), ids_of(3), do_sample=True, **options)
    assert str(error.value) == message


def test_numpy_values_are_numbers():
    x, ids = logits(2), ids_of(2)
    plain = sample_step(x, ids, temperature=0.7, top_k=5, min_p=0.05, generator=G(1))
    numpy = sample_step(x, ids, temperature=np.float32(0.7), top_k=np.int64(5), min_p=np.float64(0.05),
                        generator=G(1))
    assert torch.equal(numpy, plain)
    per_row = sample_step(x, ids, temperature=np.array([0.5, 1.2]), top_n_sigma=np.array([1.0, 2.0]),
                          generator=[G(2), G(3)])
    assert per_row.tolist() == [int(sample_step(x[r:r + 1], ids[r:r + 1], temperature=[0.5, 1.2][r],
                                                top_n_sigma=[1.0, 2.0][r], generator=G(2 + r))) for r in range(2)]
    sampler = Sampler(temperature=np.float32(0.5), repetition_penalty=np.float32(1.25))
    assert [type(p).__name__ for p in sampler.processors] == [
        "RepetitionPenaltyLogitsProcessor", "TemperatureLogitsWarper", "TopKLogitsWarper"]


@pytest.mark.parametrize("options", [
    dict(temperature=0), dict(temperature=0.0, do_sample=True), dict(temperature=0.0, top_p=0.5, top_k=3),
    dict(generation_config=GenerationConfig(temperature=0.0, do_sample=True)),
])
def test_scalar_temperature_zero_is_greedy(options):
    x, ids = logits(3), ids_of(3)
    assert torch.equal(sample_step(x, ids, **options), x.argmax(-1))


@pytest.mark.parametrize("options, kept", [
    (dict(mirostat=2), False), (dict(top_n_sigma=1.0), False), (dict(mirostat=2, top_k=50), True),
    (dict(top_n_sigma=1.0, generation_config=GenerationConfig(top_k=40)), True),
])
def test_mirostat_and_top_n_sigma_run_without_hfs_default_top_k(options, kept):
    names = [type(p).__name__ for p in Sampler(**options).processors]
    assert ("TopKLogitsWarper" in names) is kept


def _hf_row(x, ids, options):
    """HF's processors for one row's scalar options (HF builds them itself) and HF's draw."""
    processors = hf.LogitsProcessorList()
    if options.get("repetition_penalty", 1.0) != 1.0:
        processors.append(hf.RepetitionPenaltyLogitsProcessor(options["repetition_penalty"]))
    if options["temperature"] == 0:
        return processors(ids, x.clone()).argmax(-1)
    processors.append(hf.TemperatureLogitsWarper(options["temperature"]))
    if options["top_k"]:
        processors.append(hf.TopKLogitsWarper(options["top_k"]))
    if options["top_p"] < 1.0:
        processors.append(hf.TopPLogitsWarper(options["top_p"]))
    return processors(ids, x.clone())


@st.composite
def _combination(draw):
    rows = draw(st.integers(2, 4))
    options = {}
    if draw(st.booleans()):
        options["temperature"] = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5]), min_size=rows, max_size=rows))
    if draw(st.booleans()):
        options["top_k"] = draw(st.lists(st.sampled_from([0, 3, 10]), min_size=rows, max_size=rows))
    if draw(st.booleans()):
        options["top_p"] = draw(st.lists(st.sampled_from([0.5, 0.9, 1.0]), min_size=rows, max_size=rows))
    if draw(st.booleans()):
        options["repetition_penalty"] = draw(st.lists(st.sampled_from([1.0, 1.3]), min_size=rows, max_size=rows))
    community = draw(st.sampled_from(["none", "top_n_sigma", "dynatemp", "mirostat", "presence", "smoothing"]))
    if community == "top_n_sigma":
        options["top_n_sigma"] = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=rows, max_size=rows))
    elif community == "dynatemp":
        options["dynatemp_range"] = draw(st.sampled_from([0.2, [0.0, 0.3] * 2]))
    elif community == "mirostat":
        options.update(mirostat=2, mirostat_tau=draw(st.sampled_from([1.0, 3.0])))
    elif community == "presence":
        options.update(presence_penalty=[0.5 * r for r in range(rows)], penalty_last_n=-1)
    elif community == "smoothing":
        options["smoothing_factor"] = draw(st.lists(st.sampled_from([0.0, 0.3]), min_size=rows, max_size=rows))
    if isinstance(options.get("dynatemp_range"), list):
        options["dynatemp_range"] = options["dynatemp_range"][:rows]
    return rows, options, draw(st.booleans()), draw(st.booleans()), draw(st.integers(0, 1000))


@settings(max_examples=40, deadline=None)
@given(_combination())
def test_each_row_equals_that_row_alone(case):
    rows, options, fast, guidance, seed = case
    x, ids = logits(rows, seed=seed), ids_of(rows, seed=seed + 1)
    more = {}
    if guidance:
        more = dict(guidance_scale=1.5, unconditional_logits=logits(rows, seed=seed + 2))
    steps_ids = ids
    batch = sample_step(x, steps_ids, do_sample=True, fast=fast, generator=[G(seed + r) for r in range(rows)],
                        **options, **more)
    for row in range(rows):
        single = alone(x, steps_ids, row, dict(options, do_sample=True, fast=fast), seed, **more)
        assert int(batch[row]) == int(single), (row, options, fast, guidance)


@pytest.mark.parametrize("row_options", [
    dict(temperature=0.0, top_k=10, top_p=0.9, repetition_penalty=1.3),
    dict(temperature=0.7, top_k=10, top_p=0.9, repetition_penalty=1.3),
    dict(temperature=1.5, top_k=0, top_p=0.5, repetition_penalty=1.0),
])
def test_a_row_of_per_row_values_is_hfs_processors_for_that_row(row_options):
    x, ids = logits(3), ids_of(3)
    values = [dict(temperature=0.5, top_k=3, top_p=1.0, repetition_penalty=1.0), row_options,
              dict(temperature=1.0, top_k=0, top_p=0.8, repetition_penalty=1.1)]
    per_row = {name: [v[name] for v in values] for name in values[0]}
    sampler = Sampler(**per_row)
    processed = sampler.process(ids, x.clone())
    expected = _hf_row(x[1:2], ids[1:2], row_options)
    if row_options["temperature"] == 0:
        assert processed[1].argmax() == expected[0]
    else:
        assert torch.equal(processed[1:2], expected)


def test_sampler_explain_steps_the_same_state_as_the_fast_step_with_generator_lists():
    """`Sampler.explain` at some steps of a loop: the per-row state goes on as if every step were `next_tokens`."""
    rows = 3
    options = dict(mirostat=2, mirostat_tau=1.5, mirostat_eta=1.0, fast=True, top_k=[5, 10, 20])
    stepped = Sampler(generator=[G(40 + r) for r in range(rows)], **options)
    explained = Sampler(generator=[G(40 + r) for r in range(rows)], **options)
    ids = ids_of(rows)
    for step in range(5):
        x = logits(rows, seed=step)
        tokens = stepped.next_tokens(ids, x)
        other = explained.explain(ids, x)[1] if step % 2 else explained.next_tokens(ids, x)
        assert torch.equal(tokens, other), step
        ids = torch.cat([ids, tokens[:, None]], dim=1)


def test_per_row_values_in_a_generation_config_form_the_same_groups():
    x, ids = logits(2), ids_of(2)
    config = GenerationConfig(do_sample=True, top_n_sigma=[1.0, 2.0])
    got = sample_step(x, ids, generation_config=config, fast=True, generator=[G(1), G(2)])
    assert got.tolist() == [int(sample_step(x[r:r + 1], ids[r:r + 1], do_sample=True, top_n_sigma=[1.0, 2.0][r],
                                            fast=True, generator=G(1 + r))) for r in range(2)]
