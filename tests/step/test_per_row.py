"""Per-row options and per-row generators: each row equals HF's processors built for it alone."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessorList

from hfbridge import Sampler, build_processors, generate, sample_step

from _tiny_models import tiny_gpt2

V = 64


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, V, generator=g) * 3


def _alone(row_options: dict, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """HF's own processors for one row's scalar values, applied to that row alone."""
    options = dict(row_options)
    if options.get("temperature") == 0:
        del options["temperature"]
        options["do_sample"] = False
        for name in ("top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff"):
            options.pop(name, None)
    processors: LogitsProcessorList = build_processors(**options)
    return processors(ids, scores.clone())


OPTIONS = {
    "temperature": [0.5, 1.0, 0.0, 1.7, 0.5, 0.9],
    "top_k": [5, 0, 10, 3, 5, 64],
    "top_p": [0.9, 1.0, 0.5, 0.3, 0.9, 0.99],
    "min_p": [0.05, 0.0, 0.2, 0.1, 0.05, 0.5],
    "typical_p": [0.9, 1.0, 0.5, 0.95, 0.9, 0.2],
    "epsilon_cutoff": [0.001, 0.0, 0.01, 0.0005, 0.001, 0.02],
    "eta_cutoff": [0.001, 0.0, 0.01, 0.0005, 0.001, 0.02],
    "repetition_penalty": [1.2, 1.0, 2.0, 0.8, 1.2, 1.5],
    "no_repeat_ngram_size": [2, 0, 1, 3, 2, 1],
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_option_per_row_equals_hf_per_row(name):
    values = OPTIONS[name]
    rows = len(values)
    ids = torch.randint(0, V, (rows, 7), generator=torch.Generator().manual_seed(1))
    x = _logits(rows)
    extra = {} if name in ("temperature", "top_k", "top_p") else {"do_sample": True}
    sampler = Sampler(**{name: values}, **extra)
    got = sampler.process(ids, x.clone())
    for row in range(rows):
        alone = {name: values[row], **extra}
        if name == "temperature" and values[row] == 0:
            alone = {"temperature": 0}
        assert torch.equal(got[row:row + 1], _alone(alone, ids[row:row + 1], x[row:row + 1])), (name, row)


def test_several_options_per_row_with_greedy_rows_and_the_caller_untouched():
    temps, tops, penalties = [0.7, 0.0, 1.0, 0.7], [0.9, 0.5, 0.8, 0.9], [1.3, 1.0, 1.3, 1.1]
    ids = torch.randint(0, V, (4, 5), generator=torch.Generator().manual_seed(2))
    x = _logits(4, seed=3)
    before = x.clone()
    sampler = Sampler(temperature=temps, top_p=tops, repetition_penalty=penalties, top_k=20)
    got = sampler.process(ids, x.clone())
    for row in range(4):
        alone = {"temperature": temps[row], "top_p": tops[row], "repetition_penalty": penalties[row], "top_k": 20}
        assert torch.equal(got[row:row + 1], _alone(alone, ids[row:row + 1], x[row:row + 1]))
    tokens = sampler(x, ids)
    assert tokens[1] == got[1].argmax()  # temperature 0: HF's argmax of the row's scores
    assert torch.equal(x, before)


def test_all_rows_greedy_is_greedy_and_equal_values_are_one_group():
    x = _logits(3)
    assert torch.equal(sample_step(x, temperature=[0.0, 0.0, 0.0]), x.argmax(-1))
    sampler = Sampler(temperature=[0.8, 0.8, 0.8], top_p=(0.9, 0.9, 0.9))
    assert [type(p).__name__ for p in sampler.processors] == ["TemperatureLogitsWarper", "TopKLogitsWarper",
                                                               "TopPLogitsWarper"]
    assert torch.equal(sample_step(x, top_k=torch.tensor([1, 1, 1])), x.argmax(-1))


def test_a_tensor_of_values_and_a_0d_tensor():
    x = _logits(2)
    got = Sampler(top_k=torch.tensor([1, 2]), temperature=torch.tensor(0.5)).process(None, x.clone())
    for row, k in enumerate((1, 2)):
        assert torch.equal(got[row:row + 1], _alone({"top_k": k, "temperature": 0.5}, None, x[row:row + 1]))


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"top_p": [0.9, float("nan")]}, ValueError, "`top_p[1]` (row 1) must be a finite number, got nan."),
    ({"top_k": [3, 2.5]}, TypeError, "`top_k[1]` (row 1) must be an int, got float 2.5."),
    ({"temperature": [0.5, "hot"]}, TypeError, "`temperature[1]` (row 1) must be a number, got str 'hot'."),
    ({"temperature": [0.5, True]}, TypeError, "`temperature[1]` (row 1) must be a number, got bool True."),
    ({"temperature": [0.5, -1.0]}, ValueError, "`temperature[1]` (row 1) must be >= 0 (0 is greedy), got -1.0."),
    ({"top_p": [0.5, 1.5, 1.5]}, ValueError, "(the value of row 1 and 1 other rows)."),
    ({"temperature": []}, ValueError, "`temperature` is empty; pass a number, or one number per row."),
    ({"temperature": torch.ones(2, 2)}, TypeError, "got a torch.float32 tensor of shape (2, 2)"),
    ({"temperature": [0.5, 0.7], "top_p": [0.9]}, ValueError, "the same number of rows; got `temperature` 2, `top_p` 1"),
])
def test_bad_per_row_values(options, error, message):
    with pytest.raises(error) as caught:
        Sampler(**options)
    assert message in str(caught.value)


def test_wrong_number_of_rows():
    with pytest.raises(ValueError, match=r"`temperature` has 2 values, one per row, but the step has 3 rows"):
        sample_step(_logits(3), temperature=[0.5, 0.7])
    with pytest.raises(ValueError, match=r"`generator` is a list of 2 generators, one per row, but the step has 3"):
        sample_step(_logits(3), do_sample=True, generator=[torch.Generator(), torch.Generator()])
    with pytest.raises(TypeError, match=r"`generator\[1\]` must be a torch.Generator"):
        sample_step(_logits(2), do_sample=True, generator=[torch.Generator(), 1])


def _seeded(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


rows_and_order = st.lists(st.integers(0, 5), min_size=1, max_size=6, unique=True)


@settings(max_examples=25, deadline=None)
@given(order=rows_and_order, fast=st.booleans())
def test_batch_invariance_sample_step(order, fast):
    """A row's token depends on its own values and generator only: not on which rows share its batch."""
    x = _logits(6, seed=4) * 0.5
    ids = torch.randint(0, V, (6, 3), generator=torch.Generator().manual_seed(5))
    temps = [0.7, 0.0, 1.2, 0.7, 0.4, 1.0]
    tops = [0.9, 0.9, 0.5, 0.95, 0.9, 1.0]
    index = torch.tensor(order)
    batch = sample_step(x[index], ids[index], temperature=[temps[i] for i in order], top_p=[tops[i] for i in order],
                        repetition_penalty=1.1, generator=_seeded(order), fast=fast)
    for position, row in enumerate(order):
        alone = sample_step(x[row:row + 1], ids[row:row + 1], temperature=[temps[row]], top_p=[tops[row]],
                            repetition_penalty=1.1, generator=_seeded([row]), fast=fast)
        assert batch[position] == alone[0]


@settings(max_examples=10, deadline=None)
@given(order=st.lists(st.integers(0, 2), min_size=1, max_size=3, unique=True), fast=st.booleans())
def test_batch_invariance_generate_with_num_return_sequences(order, fast):
    model = tiny_gpt2()
    prompts = torch.randint(0, 48, (3, 4), generator=torch.Generator().manual_seed(6))
    temps, tops = [0.0, 0.8, 1.3], [0.9, 0.7, 1.0]
    n = 2
    index = torch.tensor(order)
    seeds = [10 * row + k for row in order for k in range(n)]
    with torch.no_grad():
        out = generate(model, prompts[index], max_new_tokens=4, temperature=[temps[i] for i in order],
                       top_p=[tops[i] for i in order], num_return_sequences=n, generator=_seeded(seeds), fast=fast)
        for position, row in enumerate(order):
            for k in range(n):
                alone = generate(model, prompts[row:row + 1], max_new_tokens=4, temperature=[temps[row]],
                                 top_p=[tops[row]], generator=_seeded([10 * row + k]), fast=fast)
                assert torch.equal(out[position * n + k], alone[0])


def test_generate_per_row_checks():
    model = tiny_gpt2()
    prompts = torch.randint(0, 48, (2, 3))
    with pytest.raises(ValueError, match=r"`temperature` has 3 values, one per row, but `input_ids` has 2 rows"):
        generate(model, prompts, max_new_tokens=2, temperature=[0.5, 0.6, 0.7])
    with pytest.raises(ValueError, match=r"a list of 2 generators, but generate\(\) makes 4 rows"):
        generate(model, prompts, max_new_tokens=2, do_sample=True, num_return_sequences=2, generator=_seeded([1, 2]))
    with pytest.raises(ValueError, match=r"`top_k` per row works with greedy decoding and sampling, not with beam"):
        generate(model, prompts, max_new_tokens=2, num_beams=2, top_k=[2, 3])


def test_generate_per_row_scores_equal_hf_per_row():
    """output_scores of a per-row batch: each row's scores are HF's for that row's values."""
    model = tiny_gpt2()
    prompts = torch.randint(0, 48, (3, 4), generator=torch.Generator().manual_seed(8))
    temps, tops = [0.6, 0.0, 1.0], [0.8, 1.0, 0.5]
    with torch.no_grad():
        out = generate(model, prompts, max_new_tokens=3, temperature=temps, top_p=tops, return_dict_in_generate=True,
                       output_scores=True, output_logits=True)
    for step, (scores, logits) in enumerate(zip(out.scores, out.logits)):
        ids = out.sequences[:, : 4 + step]
        for row in range(3):
            alone = {"temperature": temps[row], "top_p": tops[row]}
            assert torch.equal(scores[row:row + 1], _alone(alone, ids[row:row + 1], logits[row:row + 1]))


@pytest.mark.parametrize("options", [
    {"temperature": [0.5, 0.7, 1.0, 0.7, 2.0, 0.9], "top_p": 0.9, "top_k": 0},
    {"temperature": [0.5, 0.7, 1.0, 0.7, 0.0, 0.9], "top_p": [0.9, 0.5, 0.8, 0.9, 0.9, 1.0], "top_k": [0, 5, 0, 0, 3, 20]},
    {"temperature": 0.8, "min_p": [0.05, 0.1, 0.2, 0.05, 0.3, 0.0], "top_k": 0},
])
def test_fast_keeps_exact_modes_surviving_set_per_row(options):
    """fast=True with per-row values: each row's final scores are exact mode's, bit for bit."""
    x = _logits(6, seed=9)
    ids = torch.zeros(6, 0, dtype=torch.long)
    exact = Sampler(**options).process(ids, x.clone())
    fast = Sampler(**options, fast=True)
    tokens = fast.next_tokens(ids, x, check=False)
    result, _ = fast._last_fast
    scores = result.final_scores()
    samples = [t != 0 for t in (options["temperature"] if isinstance(options["temperature"], list) else [1] * 6)]
    for row in range(6):
        if samples[row]:
            assert torch.equal(scores[row], exact[row]), row
            assert exact[row, tokens[row]] > float("-inf")
        else:
            assert tokens[row] == exact[row].argmax()


@pytest.mark.parametrize("fast", [False, True])
def test_per_row_values_add_no_host_read(fast):
    """On the accelerator route, per-row values read the device no more than scalars (mixed greedy rows
    in exact mode: one read for their validity besides torch.multinomial's own)."""
    from _host_reads import HostReads

    from hfbridge._step.run.cpu_shortcuts import accelerator_route

    x, ids = _logits(6), torch.zeros(6, 3, dtype=torch.long)
    counts = {}
    for name, options in {"scalar": {"temperature": 0.8, "top_p": 0.9},
                          "same": {"temperature": [0.8] * 6, "top_p": [0.9] * 6},
                          "distinct": {"temperature": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
                                       "top_p": [0.9, 0.8, 0.7, 0.95, 0.9, 0.5]}}.items():
        sampler = Sampler(**options, fast=fast)
        with accelerator_route():
            sampler.next_tokens(ids, x, check=False)
            with HostReads() as reads:
                sampler.next_tokens(ids, x, check=False)
        counts[name] = reads.count
    assert counts["same"] == counts["distinct"] == counts["scalar"] == (0 if fast else 1)


@pytest.mark.parametrize("fast", [False, True])
def test_a_row_with_nothing_to_choose_is_named_with_greedy_rows_beside(fast):
    x = _logits(3)
    x[2] = float("nan")
    with pytest.raises(ValueError, match="row 2"):
        sample_step(x, temperature=[0.0, 0.7, 0.9], fast=fast)
    y = _logits(3)
    y[0] = float("-inf")  # a greedy row without a finite score
    with pytest.raises(ValueError, match="row 0"):
        sample_step(y, temperature=[0.0, 0.7, 0.9], fast=fast)


def test_xtc_refuses_a_list_of_per_row_generators():
    # XTC draws one coin per row from one generator: per-row generators would silently fall back otherwise
    logits = torch.randn(2, 10, generator=torch.Generator().manual_seed(0))
    generators = [torch.Generator().manual_seed(i) for i in range(2)]
    with pytest.raises(ValueError, match=r"`xtc_probability` draws one coin per row from one `generator`; a list of "
                                         r"per-row generators is not supported with XTC yet"):
        sample_step(logits, None, do_sample=True, xtc_probability=0.5, xtc_threshold=0.1, generator=generators)
