"""The samplers of hfbridge.processors as options: chain order, parity with HF's own `generate`
running the classes, GenerationConfig attributes, errors naming the option, the fast path's set."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList

from hfbridge import Recompute, Sampler, build_processors, explain_step, generate, sample_step
from hfbridge._step.fast.fast_path import fast_scores
from hfbridge.processors import (
    DRYLogitsProcessor,
    DynamicTemperatureLogitsWarper,
    MirostatLogitsWarper,
    PresenceFrequencyPenaltyLogitsProcessor,
    SmoothingLogitsWarper,
    TopNSigmaLogitsWarper,
    XTCLogitsWarper,
)

from _tiny_models import HF_MODELS, model_cache, recompute_callable

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

_model = model_cache()
PROMPT = torch.tensor([[5, 9, 13, 2, 7, 21], [0, 0, 0, 3, 4, 11]])
MASK = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])


def names(processors):
    return [type(p).__name__ for p in processors]


def test_chain_order():
    built = build_processors(temperature=0.7, top_p=0.9, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5,
                             dry_multiplier=0.8, dry_sequence_breakers=[[3]], xtc_probability=0.5, top_n_sigma=1.0,
                             smoothing_factor=0.3, mirostat=2, prompt_length=3, renormalize_logits=True, top_k=50)
    assert names(built) == [
        "RepetitionPenaltyLogitsProcessor", "PresenceFrequencyPenaltyLogitsProcessor", "DRYLogitsProcessor",
        "TemperatureLogitsWarper", "SmoothingLogitsWarper", "TopNSigmaLogitsWarper", "TopKLogitsWarper",
        "TopPLogitsWarper", "MinPLogitsWarper", "XTCLogitsWarper", "MirostatLogitsWarper", "LogitNormalization"]


def test_dynamic_temperature_replaces_temperature():
    built = build_processors(temperature=0.7, dynatemp_range=0.5, top_k=0)
    assert names(built) == ["DynamicTemperatureLogitsWarper"]
    assert built[0].temperature.values == (0.7,) and built[0].range.values == (0.5,)


def test_penalty_last_n_takes_over_repetition_penalty():
    built = build_processors(repetition_penalty=1.3, penalty_last_n=4, frequency_penalty=0.2)
    assert names(built) == ["PresenceFrequencyPenaltyLogitsProcessor"]
    ids = torch.tensor([[1, 2, 3, 4, 5, 1]])
    out = built(ids, torch.ones(1, 8))
    # only the last 4 tokens (4, 5, 1 and 3... of 3 4 5 1) count: token 2 is outside the window
    assert out[0].tolist() == pytest.approx([1, 1 / 1.3 - 0.2, 1, 1 / 1.3 - 0.2, 1 / 1.3 - 0.2, 1 / 1.3 - 0.2, 1, 1])


def test_greedy_keeps_penalties_and_drops_warpers():
    built = build_processors(do_sample=False, dry_multiplier=1.0, dry_sequence_breakers=[], top_n_sigma=1.0)
    assert names(built) == ["DRYLogitsProcessor"]


def test_a_warper_option_means_sampling():
    assert Sampler(top_n_sigma=1.0).do_sample


def test_generation_config_attributes_are_options():
    config = GenerationConfig(do_sample=True, top_k=0, top_n_sigma=1.5, xtc_probability=0.25)
    built = build_processors(config)
    assert names(built) == ["TopNSigmaLogitsWarper", "XTCLogitsWarper"]
    assert built[1].probability.values == (0.25,)


# (options for hfbridge, the processors HF's generate gets): top_k=0 so that HF's default top-k is not
# built, as HF would put it after the custom processors.
PARITY = {
    "dry_greedy": (dict(do_sample=False, dry_multiplier=0.8, dry_allowed_length=1, dry_sequence_breakers=[[3]]),
                   lambda: [DRYLogitsProcessor(0.8, allowed_length=1, sequence_breakers=[[3]])]),
    "dry_sample": (dict(do_sample=True, top_k=0, dry_multiplier=[1.5, 0.5], dry_base=1.5, dry_allowed_length=1,
                        dry_sequence_breakers=[]),
                   lambda: [DRYLogitsProcessor([1.5, 0.5], 1.5, 1, sequence_breakers=[])]),
    "presence_frequency": (dict(do_sample=True, top_k=0, presence_penalty=1.5, frequency_penalty=[0.5, 2.0]),
                           lambda: [PresenceFrequencyPenaltyLogitsProcessor(1.5, [0.5, 2.0], prompt_length=6)]),
    "xtc": (dict(do_sample=True, top_k=0, xtc_threshold=0.02, xtc_probability=0.7),
            lambda: [XTCLogitsWarper(0.02, 0.7)]),
    "top_n_sigma": (dict(do_sample=True, top_k=0, top_n_sigma=[1.0, 0.5]), lambda: [TopNSigmaLogitsWarper([1.0, 0.5])]),
    "dynatemp": (dict(do_sample=True, top_k=0, temperature=0.8, dynatemp_range=0.6, dynatemp_exponent=2.0),
                 lambda: [DynamicTemperatureLogitsWarper(0.8, 0.6, 2.0)]),
    "smoothing": (dict(do_sample=True, top_k=0, smoothing_factor=0.4, smoothing_curve=2.0),
                  lambda: [SmoothingLogitsWarper(0.4, 2.0)]),
    "mirostat": (dict(do_sample=True, top_k=0, mirostat=2, mirostat_tau=2.0, mirostat_eta=0.3),
                 lambda: [MirostatLogitsWarper(2.0, 0.3)]),
}


@pytest.mark.parametrize("model_name", list(HF_MODELS))
@pytest.mark.parametrize("case", list(PARITY))
def test_hf_generate_with_the_classes_equals_hfbridge_with_the_options(case, model_name):
    options, processors = PARITY[case]
    hf = _model(model_name)
    hf_options = {k: v for k, v in options.items() if k in ("do_sample", "top_k")}
    torch.manual_seed(7)
    theirs = hf.generate(PROMPT, attention_mask=MASK, use_cache=False, max_new_tokens=12,
                         logits_processor=LogitsProcessorList(processors()), **hf_options)
    torch.manual_seed(7)
    ours = generate(Recompute(recompute_callable(hf)), PROMPT, attention_mask=MASK, max_new_tokens=12, **options)
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"


def test_stateful_processor_is_fresh_in_every_generate_call():
    hf = _model("llama")
    warper = MirostatLogitsWarper(2.0, 0.3)  # one instance, two HF generate calls
    outputs = []
    for _ in range(2):
        torch.manual_seed(3)
        outputs.append(hf.generate(PROMPT, attention_mask=MASK, use_cache=False, max_new_tokens=10, do_sample=True,
                                   top_k=0, logits_processor=LogitsProcessorList([warper])))
    assert torch.equal(outputs[0], outputs[1])


def test_generator_drives_xtc_in_generate():
    hf = _model("gpt2")
    model = Recompute(recompute_callable(hf))
    runs = [generate(model, PROMPT, attention_mask=MASK, max_new_tokens=10, top_k=0, xtc_threshold=0.02,
                     xtc_probability=0.5, generator=torch.Generator().manual_seed(11)) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


def test_dry_prevents_a_repeat_in_generate():
    # a model that always prefers to continue the cycle 1 2 3 1 2 3: DRY breaks it
    def model(input_ids, attention_mask):
        logits = torch.full((*input_ids.shape, 8), -2.0)
        logits[..., :] += torch.nn.functional.one_hot((input_ids % 3) + 1, 8) * 3
        return logits

    prompt = torch.tensor([[1, 2, 3, 1, 2, 3]])
    plain = generate(Recompute(model), prompt, max_new_tokens=6)
    dry = generate(Recompute(model), prompt, max_new_tokens=6, dry_multiplier=2.0, dry_sequence_breakers=[])
    assert plain[0, 6:].tolist() == [1, 2, 3, 1, 2, 3]
    assert dry[0, 6:].tolist() != [1, 2, 3, 1, 2, 3]


@pytest.mark.parametrize("options,message", [
    (dict(dry_multiplier=1.0, dry_base=0.5), r"^`dry_base` must be >= 1.0, got 0.5.$"),
    (dict(dry_multiplier=1.0), r"DRY's sequence breakers .* are strings: pass `tokenizer=`"),
    (dict(dry_multiplier=1.0, dry_sequence_breakers="\n"), r"^`dry_sequence_breakers` must be a list"),
    (dict(xtc_probability=1.5), r"^`xtc_probability` must be <= 1.0, got 1.5.$"),
    (dict(xtc_probability=0.5, xtc_threshold=0.0), r"^`xtc_threshold` must be > 0.0, got 0.0.$"),
    (dict(top_n_sigma=0.0), r"^`top_n_sigma` must be > 0.0, got 0.0.$"),
    (dict(mirostat=3), r"^`mirostat` must be 0 \(off\), 1 \(mirostat 1.0\) or 2"),
    (dict(mirostat=2, mirostat_tau=-1.0), r"^`mirostat_tau` must be > 0.0, got -1.0.$"),
    (dict(smoothing_factor=0.5, smoothing_curve=0.2), r"^`smoothing_curve` must be >= 1.0, got 0.2.$"),
    (dict(dynatemp_range=-0.1), r"^`dynatemp_range` must be >= 0.0, got -0.1.$"),
    (dict(penalty_last_n=-2, presence_penalty=0.1), r"^`penalty_last_n` must be >= -1, got -2.$"),
    (dict(presence_penalty=0.5), r"need `prompt_length=`.*`penalty_last_n=`"),
    (dict(dry_multiplier=[1.0, 2.0, 3.0], dry_sequence_breakers=[]),
     r"^`dry_multiplier` has 3 values, one per row, but the step has 2 rows; pass one value per row, "
     r"or a single number for every row.$"),
])
def test_bad_options_name_the_option(options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        sample_step(torch.zeros(2, 10), torch.zeros(2, 4, dtype=torch.long), **options)


def test_bad_option_in_generation_config_says_so():
    with pytest.raises(ValueError, match=r"^`top_n_sigma` must be > 0.0, got -1.0 \(in `generation_config`\).$"):
        Sampler(GenerationConfig(do_sample=True, top_n_sigma=-1.0))


def test_generate_refuses_a_bad_option_before_the_model_runs():
    def model(input_ids):
        raise AssertionError("the model must not run")

    with pytest.raises(ValueError, match="`dry_allowed_length` must be >= 1"):
        generate(model, torch.tensor([[1, 2]]), max_new_tokens=2, dry_multiplier=1.0, dry_allowed_length=0)


ALL = dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02, presence_penalty=0.3, frequency_penalty=0.2,
           penalty_last_n=-1, dry_multiplier=0.8, dry_sequence_breakers=[[3]], dry_allowed_length=1,
           xtc_probability=1.0, xtc_threshold=0.05, top_n_sigma=1.5, smoothing_factor=0.2, dynatemp_range=0.3)


def test_fast_path_keeps_exact_modes_set():
    torch.manual_seed(0)
    ids = torch.randint(0, 20, (4, 30))
    for trial in range(5):
        scores = torch.randn(4, 500) * (1 + trial)
        exact = Sampler(**ALL).process(ids, scores.clone())
        fast = fast_scores(ids, scores.clone(), Sampler(**ALL, fast=True).processors)
        assert torch.equal(torch.isfinite(exact), torch.isfinite(fast))
        torch.testing.assert_close(fast[torch.isfinite(fast)], exact[torch.isfinite(exact)])


def test_fast_path_draws_from_the_set():
    torch.manual_seed(0)
    ids = torch.randint(0, 20, (4, 30))
    scores = torch.randn(4, 500) * 3
    kept = torch.isfinite(Sampler(**ALL).process(ids, scores.clone()))
    sampler = Sampler(**ALL, fast=True, generator=torch.Generator().manual_seed(5))
    for _ in range(50):
        tokens = sampler(scores, ids)
        assert bool(kept.gather(1, tokens[:, None]).all())


def test_explain_step_shows_each_sampler():
    trace = explain_step(torch.randn(1, 40), torch.randint(0, 40, (1, 12)), dry_multiplier=1.0,
                         dry_sequence_breakers=[], top_n_sigma=1.0, xtc_probability=1.0, top_k=0)
    assert [stage.name for stage in trace.stages] == ["input", "DRYLogitsProcessor",
                                                      "TopNSigmaLogitsWarper", "XTCLogitsWarper"]
    assert trace.stages[-1].possible < trace.stages[0].possible


def test_sample_step_draws_xtcs_coin_from_the_generator():
    scores = torch.tensor([[3.0, 3.0, 2.9, 0.0]]).repeat(64, 1)
    runs = [sample_step(scores, xtc_probability=0.5, xtc_threshold=0.1, top_k=0,
                        generator=torch.Generator().manual_seed(seed)) for seed in (1, 1, 2)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    # rows where XTC applied drew token 2 (the least likely top choice) or 3
    assert 10 < int((runs[0] >= 2).sum()) < 54


def test_sample_step_takes_a_tokenizer_for_dry():
    from hfbridge.demo import load_demo_tokenizer

    tokenizer = load_demo_tokenizer()
    ids = torch.tensor([tokenizer("the cat and the dog and the cat and the").input_ids])
    scores = torch.zeros(1, len(tokenizer))
    scores[0, ids[0, 2]] = 5.0  # the model wants " cat" again, which would extend the repeat " and the"
    plain = sample_step(scores, ids)
    dry = sample_step(scores, ids, dry_multiplier=10.0, tokenizer=tokenizer)
    assert plain.item() == ids[0, 2].item() and dry.item() != plain.item()


def test_generate_reads_the_options_from_a_generation_config():
    model = Recompute(recompute_callable(_model("gpt2")))
    config = GenerationConfig(do_sample=True, top_k=0, top_n_sigma=0.8, dry_multiplier=1.0, dry_sequence_breakers=[],
                              max_new_tokens=10)
    torch.manual_seed(5)
    from_config = generate(model, PROMPT, attention_mask=MASK, generation_config=config)
    torch.manual_seed(5)
    from_keywords = generate(model, PROMPT, attention_mask=MASK, max_new_tokens=10, do_sample=True, top_k=0,
                             top_n_sigma=0.8, dry_multiplier=1.0, dry_sequence_breakers=[])
    assert torch.equal(from_config, from_keywords)
