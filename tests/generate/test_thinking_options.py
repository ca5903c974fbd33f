"""`thinking_options=`: other options while a row is thinking, token for token equal to a hand loop that
steps each row with the sampler of its phase (one per row and phase, each with the row's own generator):
greedy outside and sampled inside, temperatures, penalties, the community samplers (DRY, XTC, mirostat,
each phase's state its own), per-row values, the thinking budget's forced end, `fast=True`; prompts that
open a span and prompts that do not; `sample_step` and `explain_step`; refusals before any model call."""

from __future__ import annotations

import pytest
import torch

from hfbridge import Sampler, explain_step, generate, sample_step

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

V = 16
START, END = [7], [8, 9]
TAGS = dict(thinking_start=START, thinking_end=END)
PROMPTS = torch.tensor([[1, 7, 2], [1, 2, 3], [4, 7, 5]])  # rows 0 and 2 open a span, row 1 does not
STEPS = 12


def _table(seed=0):
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(seed)) * 1.5
    table[:, 8] += 1.0  # the end tag's first token is likely: spans close
    table[8, 9] += 4.0  # and its second follows it
    table[3, 7] += 2.5  # token 3 often opens a span again
    return table


def _thinking(ids):
    """A row's phase by hand: its last start tag ends after its last end tag."""
    def last_end(tag):
        ends = [i + len(tag) for i in range(len(ids) - len(tag) + 1) if ids[i:i + len(tag)] == tag]
        return max(ends, default=0)
    return last_end(START) > last_end(END)


def _hand_loop(table, prompts, base, thinking, seeds, fast=False):
    """Each row stepped alone by the Sampler of its phase (built once per row and phase, the row's own
    generator shared by both); an option given as a tuple has one value per row."""
    rows = []
    phases_seen = []
    for row in range(prompts.shape[0]):
        def own(options):
            return {name: (value[row] if isinstance(value, tuple) else value) for name, value in options.items()}
        generator = torch.Generator().manual_seed(seeds[row])
        answer = Sampler(generator=generator, prompt_length=prompts.shape[1], fast=fast, **own(base), **TAGS)
        inside = Sampler(generator=generator, prompt_length=prompts.shape[1], fast=fast,
                         **{**own(base), **own(thinking)}, **TAGS)
        ids = prompts[row:row + 1]
        seen = []
        for _ in range(STEPS):
            phase = _thinking(ids[0].tolist())
            seen.append(phase)
            token = (inside if phase else answer)(table[ids][:, -1], ids)
            ids = torch.cat([ids, token[:, None]], dim=1)
        rows.append(ids[0])
        phases_seen.append(seen)
    return torch.stack(rows), phases_seen


def _generate(table, prompts, base, thinking, seeds, fast=False):
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    return generate(lambda ids: table[ids], prompts, max_new_tokens=STEPS, generator=generators, fast=fast,
                    thinking_options=thinking, **base, **TAGS)


CASES = {
    "greedy outside, sampled inside": ({}, {"do_sample": True, "top_k": 6}),
    "sampled outside, greedy inside": ({"do_sample": True, "top_p": 0.9}, {"temperature": 0}),
    "temperatures and truncation": ({"temperature": 0.6, "top_k": 0}, {"temperature": 1.4, "top_p": 0.8,
                                                                      "min_p": 0.05}),
    "penalties": ({"do_sample": True, "top_k": 0}, {"repetition_penalty": 1.8, "presence_penalty": 0.7,
                                                   "frequency_penalty": 0.3, "no_repeat_ngram_size": 2}),
    "DRY inside, top-n-sigma outside": ({"top_n_sigma": 1.0}, {"dry_multiplier": 0.8, "dry_allowed_length": 1,
                                                               "dry_sequence_breakers": [], "top_n_sigma": None}),
    "mirostat in both phases, each its own state": ({"mirostat": 2, "mirostat_tau": 2.0},
                                                    {"mirostat_tau": 4.0, "mirostat_eta": 0.3}),
    "mirostat 1 outside, adaptive-p inside": ({"mirostat": 1, "mirostat_tau": 3.0},
                                              {"mirostat": 0, "adaptive_target": 0.3}),
    "the budget forces the end": ({"thinking_budget": 2}, {"do_sample": True, "temperature": 1.5}),
    # every phase greedy: both run on every row, each row's token picked on the device (no host read)
    "greedy, penalties inside": ({}, {"repetition_penalty": 3.0, "no_repeat_ngram_size": 2}),
    "greedy, per-row penalties, a budget": ({"repetition_penalty": (1.0, 1.5, 2.0), "thinking_budget": 3},
                                            {"suppress_tokens": [3], "repetition_penalty": (2.0, 1.0, 3.0)}),
}


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_generate_equals_the_hand_loop(case, fast):
    base, thinking = CASES[case]
    table = _table()
    seeds = [11, 12, 13]
    expected, phases = _hand_loop(table, PROMPTS, base, thinking, seeds, fast=fast)
    got = _generate(table, PROMPTS, base, thinking, seeds, fast=fast)
    assert torch.equal(got, expected)
    # not vacuous: rows were thinking and answering
    flat = [phase for row in phases for phase in row]
    assert any(flat) and not all(flat)


def test_greedy_phases_choose_without_a_host_read():
    from _host_reads import HostReads

    from hfbridge import accelerator_route

    table = _table()
    ids = torch.cat([PROMPTS, torch.tensor([[3], [7], [8]])], 1)
    # HF's own NoRepeatNGramLogitsProcessor reads the ids on the host on some transformers lines: left out here
    for base, thinking in (({}, {"repetition_penalty": 3.0, "suppress_tokens": [3]}),
                           ({"thinking_budget": 1}, {"repetition_penalty": 2.0})):
        sampler = Sampler(prompt_length=3, thinking_options=thinking, **base, **TAGS)
        with accelerator_route(), HostReads() as reads:  # what an accelerator runs (on CPU a read is free)
            for _ in range(4):
                result = sampler.step(ids, table[ids][:, -1])
                ids = torch.cat([ids, result.tokens[:, None]], 1)
        assert reads.count == 0, reads.ops
    sampled = Sampler(thinking_options={"do_sample": True}, **TAGS)
    with HostReads() as reads:
        sampled.step(ids, table[ids][:, -1])
    assert reads.ops["tolist"] == 1  # a sampled phase: the rows' phases read once, to split them


def test_rows_change_phase_while_generating():
    _, phases = _hand_loop(_table(), PROMPTS, *CASES["greedy outside, sampled inside"], [11, 12, 13])
    assert [len(set(row)) for row in phases] == [2, 1, 2]  # row 1 never opens a span


def test_the_phases_change_the_tokens():
    # the same call without thinking_options draws other tokens: the thinking rows' options were used
    table, seeds = _table(), [1, 2, 3]
    base, thinking = CASES["greedy outside, sampled inside"]
    phased = _generate(table, PROMPTS, base, thinking, seeds)
    assert not torch.equal(phased, _generate(table, PROMPTS, base, None, seeds))


def test_the_budget_forced_end_switches_the_phase():
    base, thinking = {"thinking_budget": 2}, {"do_sample": True, "temperature": 1.5}
    table = _table()
    table[:, 8] -= 20.0  # the model never ends a span itself: the budget does
    got = _generate(table, PROMPTS[:1], base, thinking, [5])
    new = got[0, 3:].tolist()
    assert new[2:4] == END  # two thinking tokens, then the forced end tag
    expected, phases = _hand_loop(table, PROMPTS[:1], base, thinking, [5])
    assert torch.equal(got, expected)
    assert phases[0][:4] == [True, True, True, True] and phases[0][4] is False  # answering after the end


def test_per_row_values_in_both_phases():
    base = {"temperature": (0.5, 1.0, 0.8), "top_k": 0}
    thinking = {"top_k": (2, 5, 0), "repetition_penalty": (1.0, 1.5, 2.0)}
    table, seeds = _table(3), [7, 8, 9]
    expected, _ = _hand_loop(table, PROMPTS, base, thinking, seeds)
    assert torch.equal(_generate(table, PROMPTS, base, thinking, seeds), expected)


def test_xtc_with_one_generator_draws_the_answering_rows_then_the_thinking_ones():
    # XTC takes one generator: the draws go unit by unit; with one row, as the hand loop draws them
    base, thinking = {"do_sample": True}, {"xtc_threshold": 0.05, "xtc_probability": 0.7}
    table = _table(4)
    for prompt in (PROMPTS[:1], PROMPTS[1:2]):
        got = generate(lambda ids: table[ids], prompt, max_new_tokens=STEPS,
                       generator=torch.Generator().manual_seed(3), thinking_options=thinking, **base, **TAGS)
        expected, _ = _hand_loop(table, prompt, base, thinking, [3])
        assert torch.equal(got, expected)


def test_sample_step_and_explain_step_take_each_rows_phase():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    ids = PROMPTS
    thinking = {"do_sample": True, "temperature": 2.0, "top_k": 4}
    got = sample_step(logits, ids, thinking_options=thinking, generator=[torch.Generator().manual_seed(s)
                                                                         for s in (1, 2, 3)], **TAGS)
    for row, seed in enumerate((1, 2, 3)):
        options = thinking if _thinking(ids[row].tolist()) else {}
        alone = sample_step(logits[row:row + 1], ids[row:row + 1], generator=torch.Generator().manual_seed(seed),
                            **options)
        assert got[row] == alone[0]
        trace = explain_step(logits, ids, row=row, thinking_options=thinking, generator=[
            torch.Generator().manual_seed(s) for s in (1, 2, 3)], **TAGS)
        assert trace.token == int(got[row])
        assert trace.phase == ("thinking" if row != 1 else "answer")
        assert f"row {row} of 3 ({trace.phase})" in trace.summary()
        names = [stage.name for stage in trace.stages[1:]]
        assert names == (["TemperatureLogitsWarper", "TopKLogitsWarper"] if row != 1 else [])


def _word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<think>": 1, "</think>": 2, "a": 3, "b": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


def test_tags_as_strings_with_a_tokenizer():
    tokenizer = _word_tokenizer()
    logits = torch.tensor([[0.0, 0.0, 0.0, 1.0, 3.0]] * 2)
    # greedy answers 4; while thinking, 4 is banned
    got = sample_step(logits, torch.tensor([[3, 1], [1, 2]]), tokenizer=tokenizer,
                      thinking_options={"suppress_tokens": [4]})
    assert got.tolist() == [3, 4]


class _NeverCalled:
    def __call__(self, input_ids):
        raise AssertionError("the model was called")


@pytest.mark.parametrize("thinking,options,error,message", [
    ([("temperature", 0.5)], {}, TypeError,
     r"^`thinking_options` must be a mapping of the options that differ while a row is thinking "
     r"\(e.g. \{'temperature': 0.8\}\), got list.$"),
    ({"temprature": 0.5}, {}, TypeError,
     r"^`thinking_options` holds an unknown option `temprature`. Did you mean `temperature`\?$"),
    ({"num_beams": 2}, {}, ValueError,
     r"^`thinking_options` holds `num_beams`, an option of the whole call \(the strategy, the lengths, the special "
     r"tokens\), which cannot differ by phase: pass it beside `thinking_options`.$"),
    ({"max_new_tokens": 2}, {}, ValueError, r"^`thinking_options` holds `max_new_tokens`, an option of the whole"),
    ({"thinking_options": {}}, {}, ValueError, r"^`thinking_options` holds `thinking_options`: phases do not nest"),
    ({"thinking_end": [3]}, {}, ValueError,
     r"^`thinking_options` holds `thinking_end`, which finds the phase and so is the same in both"),
    ({"temperature": -1.0}, {}, ValueError, r"^`thinking_options`: `temperature` "),
    ({"top_k": [1, 2, 3]}, {}, ValueError, r"^`thinking_options`: `top_k` has 3 values, one per row, but `input_ids` has 1 rows"),
    ({"dry_multiplier": "x"}, {}, TypeError, r"^`thinking_options`: `dry_multiplier` must be"),
    ({"temperature": 0.5}, {"num_beams": 2}, ValueError,
     r"^`thinking_options` works with greedy search and sampling, not with beam search"),
    ({"temperature": 0.5}, {"banned_strings": ["a"], "tokenizer": "tok"}, ValueError,
     r"^`thinking_options` with `banned_strings` / `banned_regex` is not supported"),
    ({"temperature": 0.5}, {"processors": [lambda ids, scores: scores]}, ValueError,
     r"^`thinking_options` with `processors=` is not supported"),
])
def test_refused_before_any_model_call(thinking, options, error, message):
    options = dict(options)
    tags = {} if "thinking_end" in (thinking if isinstance(thinking, dict) else {}) else TAGS
    if options.get("tokenizer") == "tok":
        options["tokenizer"] = _word_tokenizer()
    with pytest.raises(error, match=message):
        generate(_NeverCalled(), PROMPTS[:1], max_new_tokens=2, thinking_options=thinking, **tags, **options)


def test_tags_needed_and_other_refusals():
    with pytest.raises(ValueError, match=r"^`thinking_start` is a string \('<think>'\): `thinking_options` finds "
                                         r"the thinking phase by its tags, so pass `tokenizer=`"):
        Sampler(thinking_options={"temperature": 0.5})
    with pytest.raises(ValueError, match=r"^`with_generator` cannot give a new generator to a Sampler with "
                                         r"`thinking_options`"):
        Sampler(thinking_options={"temperature": 0.5}, **TAGS).with_generator(torch.Generator())
    sampler = Sampler(thinking_options={"mirostat": 2}, **TAGS)
    assert sampler.is_stateful
    with pytest.raises(ValueError, match=r"^`reorder` is not supported with `thinking_options`"):
        sampler.reorder(torch.tensor([0]))


def test_inputs_untouched_and_greedy_phases_agree_with_plain_greedy():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    before, ids_before = logits.clone(), PROMPTS.clone()
    # both phases greedy and the same options: plain greedy
    got = sample_step(logits, PROMPTS, thinking_options={"do_sample": False}, **TAGS)
    assert torch.equal(got, logits.argmax(-1))
    assert torch.equal(logits, before) and torch.equal(PROMPTS, ids_before)


def test_explain_generation_marks_each_steps_phase_and_its_scores_are_that_phases():
    from hfbridge import explain_generation

    table, seeds = _table(), [11, 12, 13]
    base, thinking = CASES["greedy outside, sampled inside"]  # top_k=6 while thinking, nothing while answering
    out = generate(lambda ids: table[ids], PROMPTS, max_new_tokens=STEPS, thinking_options=thinking,
                   generator=[torch.Generator().manual_seed(seed) for seed in seeds], return_dict_in_generate=True,
                   output_scores=True, **TAGS)
    expected, phases = _hand_loop(table, PROMPTS, base, thinking, seeds)
    assert torch.equal(out.sequences, expected)
    for row in range(3):
        trace = explain_generation(out, row=row, thinking_start=START, thinking_end=END)
        assert [step.thinking for step in trace.steps] == phases[row]
        assert [step.possible for step in trace.steps] == [6 if phase else V for phase in phases[row]]
        assert ("(thinking)" in str(trace)) == any(phases[row])
    assert explain_generation(out).steps[0].thinking is None
    with pytest.raises(ValueError, match=r"^explain_generation\(\): pass both `thinking_start` and `thinking_end`"):
        explain_generation(out, thinking_start=START)
    with pytest.raises(ValueError, match=r"^generate\(\): `output_scores=True` with `fast=True` and "):
        generate(_NeverCalled(), PROMPTS, max_new_tokens=2, thinking_options=thinking, fast=True,
                 return_dict_in_generate=True, output_scores=True, **TAGS)


def test_vllm_requests_refuse_thinking_options_by_name():
    from types import SimpleNamespace

    from hfbridge.vllm._sampling_params import check_request

    params = SimpleNamespace(extra_args={"hfbridge": {"thinking_options": {"temperature": 1.0}}}, temperature=0.0,
                             top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                             frequency_penalty=0.0)
    with pytest.raises(ValueError, match=r"^`thinking_options` is not taken in vLLM: vLLM's processor runs one chain "
                                         r"per request, not one per phase, yet.$"):
        check_request(params)


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("thinking", [{"do_sample": True}, {"do_sample": False}, {"top_k": 3}])
def test_errors_name_the_batchs_row(thinking, fast):
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    logits[2, 3] = float("nan")  # row 2 is thinking: its phase's sampler sees it as its second row
    with pytest.raises(ValueError, match=r"^`logits` contain NaN in row 2 \(1 of 3 rows have NaN\)"):
        sample_step(logits, PROMPTS, thinking_options=thinking, fast=fast, **TAGS)


def test_numpy_values_bad_types_and_the_callers_dict():
    np = pytest.importorskip("numpy")
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1))
    thinking = {"do_sample": True, "temperature": np.float32(0.5), "top_k": np.array([2, 3, 4])}
    kept = dict(thinking)
    seeds = (1, 2, 3)
    got = sample_step(logits, PROMPTS, thinking_options=thinking, **TAGS,
                      generator=[torch.Generator().manual_seed(s) for s in seeds])
    assert thinking.keys() == kept.keys() and all(thinking[k] is kept[k] for k in kept)  # untouched
    for row, seed in enumerate(seeds):
        options = {"do_sample": True, "temperature": 0.5, "top_k": int(thinking["top_k"][row])} \
            if row != 1 else {}
        assert got[row] == sample_step(logits[row:row + 1], PROMPTS[row:row + 1],
                                       generator=torch.Generator().manual_seed(seed), **options)[0]
    with pytest.raises(TypeError, match=r"^`thinking_options`: `do_sample` must be a bool \(True or False\), got str"):
        Sampler(thinking_options={"do_sample": "yes"}, **TAGS)
    with pytest.raises(TypeError, match=r"^`thinking_options` keys must be option names \(str\), got int 3.$"):
        Sampler(thinking_options={3: 1.0}, **TAGS)
    sampler = Sampler(thinking_options={"top_k": [2, 3]}, **TAGS)
    with pytest.raises(ValueError, match=r"^`thinking_options`: the phases were built for 2 rows \(values or "
                                         r"generators per row\), but the step has 3 rows.$"):
        sampler(logits, PROMPTS)


def test_an_empty_span_and_no_context():
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(2))
    # no input_ids: no row is thinking; a prompt of the end tag alone: answering
    assert torch.equal(sample_step(logits, thinking_options={"temperature": 0}, do_sample=True, top_k=1, **TAGS),
                       logits.argmax(-1))
    ids = torch.tensor([[7, 8, 9], [8, 9, 7]])  # row 0: opened and closed; row 1: open
    trace = explain_step(logits, ids, row=1, thinking_options={"suppress_tokens": [int(logits[1].argmax())]},
                         **TAGS)
    assert trace.phase == "thinking" and trace.token != int(logits[1].argmax())
    assert explain_step(logits, ids, row=0, thinking_options={"suppress_tokens": [0]}, **TAGS).phase == "answer"


def test_num_return_sequences_expands_the_values_per_prompt():
    table, seeds = _table(5), [21, 22, 23, 24]
    prompts = PROMPTS[[0, 1]]
    base = {"do_sample": True, "top_k": 0}
    thinking = {"temperature": (1.5, 0.5), "top_k": (3, 0)}
    got = generate(lambda ids: table[ids], prompts, max_new_tokens=STEPS, num_return_sequences=2,
                   generator=[torch.Generator().manual_seed(seed) for seed in seeds], thinking_options=thinking,
                   **base, **TAGS)
    expanded = {name: tuple(value for value in values for _ in range(2)) for name, values in thinking.items()}
    expected, _ = _hand_loop(table, prompts.repeat_interleave(2, dim=0), base, expanded, seeds)
    assert torch.equal(got, expected)
    with pytest.raises(ValueError, match=r"^`thinking_options`: `temperature` has 3 values, one per row, but "
                                         r"`input_ids` has 2 rows"):
        generate(_NeverCalled(), prompts, max_new_tokens=2, thinking_options={"temperature": (1.0, 1.0, 1.0)},
                 **TAGS)


def test_a_transformers_model_passed_as_it_is():
    from _tiny_models import tiny_llama

    hf = tiny_llama()
    prompts = torch.tensor([[1, 7, 2], [1, 2, 3]])
    plain = generate(hf, prompts, max_new_tokens=6)
    banned = int(plain[0, 3])  # row 0's first greedy token, while its span is open
    out = generate(hf, prompts, max_new_tokens=6, thinking_options={"suppress_tokens": [banned]}, **TAGS)
    phases = [[_thinking(out[row, :3 + step].tolist()) for step in range(6)] for row in range(2)]
    for row in range(2):
        if not any(phases[row]):  # never thinking: the model's own greedy tokens
            assert torch.equal(out[row], plain[row])
        for step, phase in enumerate(phases[row]):
            if phase:
                assert int(out[row, 3 + step]) != banned
    assert phases[0][0] and int(out[0, 3]) != int(plain[0, 3])


@pytest.mark.parametrize("thinking,options", [({"do_sample": True}, {}), ({"do_sample": True}, {"fast": True}),
                                              ({"repetition_penalty": 1.5}, {})])
def test_generate_names_the_step_and_the_batchs_row(thinking, options):
    table = _table()

    def model(ids):
        out = table[ids].clone()
        if ids.shape[1] >= 4:
            out[2, -1, 5] = float("nan")  # row 2, thinking, at step 1
        return out

    with pytest.raises(ValueError, match=r"^generate\(\): at step 1: `logits` contain NaN in row 2 \(1 of 3 rows"):
        generate(model, PROMPTS, max_new_tokens=4, thinking_options=thinking, **TAGS, **options)


def test_one_generator_draws_the_answering_rows_then_the_thinking_ones():
    table = _table(6)
    base, thinking = {"do_sample": True, "top_k": 0}, {"temperature": 1.5}
    got = generate(lambda ids: table[ids], PROMPTS, max_new_tokens=STEPS, thinking_options=thinking,
                   generator=torch.Generator().manual_seed(4), **base, **TAGS)
    # by hand: each step, the answering rows together, then the thinking rows, from the one generator
    generator = torch.Generator().manual_seed(4)
    answer = Sampler(generator=generator, prompt_length=3, **base, **TAGS)
    inside = Sampler(generator=generator, prompt_length=3, **base, **thinking, **TAGS)
    ids = PROMPTS
    seen = set()
    for _ in range(STEPS):
        phases = [_thinking(row) for row in ids.tolist()]
        seen.add(tuple(phases))
        tokens = torch.empty(3, dtype=torch.long)
        for sampler, phase in ((answer, False), (inside, True)):
            rows = [row for row in range(3) if phases[row] == phase]
            if rows:
                tokens[rows] = sampler(table[ids[rows]][:, -1], ids[rows])
        ids = torch.cat([ids, tokens[:, None]], 1)
    assert torch.equal(got, ids)
    assert len(seen) > 1  # the split changed while generating
