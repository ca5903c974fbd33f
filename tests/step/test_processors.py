"""The built processor list is HF's own: same classes, same parameters, same order, same tokens."""

import contextlib
import re

import pytest
import torch
import transformers
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge import Sampler, build_processors, sample_step
from hfbridge._hf.stand_in import generation_option_names

PROMPT = torch.tensor([[0, 0, 5, 6, 7, 5], [3, 4, 5, 6, 7, 8]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])

CONFIGS = [
    {},
    {"do_sample": True},
    {"temperature": 0.7},
    {"temperature": 0.7, "top_k": 5, "top_p": 0.9},
    {"top_k": 0, "top_p": 0.8},
    {"min_p": 0.1, "temperature": 1.5},
    {"typical_p": 0.8},
    {"epsilon_cutoff": 0.02},
    {"eta_cutoff": 0.02},
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 1.3, "temperature": 0.9, "top_k": 8, "top_p": 0.95},
    {"no_repeat_ngram_size": 2},
    {"bad_words_ids": [[3], [4, 5]]},
    {"sequence_bias": {(9,): 4.0, (5, 6): -2.0}},
    {"min_length": 9},
    {"min_new_tokens": 3},
    {"forced_bos_token_id": 1},
    {"forced_eos_token_id": 2},
    {"suppress_tokens": [5, 6, 7]},
    {"begin_suppress_tokens": [8, 9]},
    {"exponential_decay_length_penalty": (0, 1.5)},
    {"remove_invalid_values": True},
    {"renormalize_logits": True, "top_k": 4},
    {"do_sample": False, "repetition_penalty": 1.2, "no_repeat_ngram_size": 3, "renormalize_logits": True},
]
if "top_h" in generation_option_names():
    CONFIGS.append({"top_h": 0.5})


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=40, n_positions=64, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2()


def hf_generate_step(model, options, seed):
    """One step of HF's own generate, recording the processor list it built."""
    captured = {}
    original = model._get_logits_processor

    def recording(*args, **kwargs):
        captured["processors"] = original(*args, **kwargs)
        return captured["processors"]

    model._get_logits_processor = recording
    try:
        torch.manual_seed(seed)
        out = model.generate(PROMPT, attention_mask=MASK, max_new_tokens=1, output_logits=True,
                             output_scores=True, return_dict_in_generate=True, **options)
    finally:
        del model._get_logits_processor
    return out, captured["processors"]


def comparable(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.tolist())
    if isinstance(value, dict):
        return {key: comparable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(comparable(item) for item in value)
    return value


def describe(processors):
    return [(type(p).__name__, comparable(vars(p))) for p in processors]


@pytest.mark.parametrize("options", CONFIGS, ids=lambda o: ",".join(o) or "defaults")
def test_processor_list_and_tokens_equal_hf_generate(model, options):
    sampler = Sampler(model.generation_config, prompt_length=PROMPT.shape[1], attention_mask=MASK,
                      max_new_tokens=1, **options)
    # HF's generate needs do_sample spelled out; hfbridge infers it from the sampling options.
    # A minimum length beyond generate's one new token is what these cases test; HF warns about it.
    unfeasible = "min_length" in options or "min_new_tokens" in options
    with pytest.warns(UserWarning, match="Unfeasible length constraints") if unfeasible else contextlib.nullcontext():
        out, hf_processors = hf_generate_step(model, {**options, "do_sample": sampler.do_sample}, seed=3)
    raw = out.logits[0]  # [B, V] float32, what HF's generate fed to the processors
    torch.testing.assert_close(sampler.process(sampler.input_rows(PROMPT, raw), raw.clone()), out.scores[0])
    # After one call, as some processors prepare tensors lazily on their first call.
    assert describe(sampler.processors) == describe(hf_processors)
    torch.manual_seed(3)
    tokens = sample_step(raw, PROMPT, generation_config=model.generation_config,
                         prompt_length=PROMPT.shape[1], attention_mask=MASK, max_new_tokens=1, **options)
    assert torch.equal(tokens, out.sequences[:, -1])


def test_user_processors_merge_like_generate(model):
    class Shift:
        def __call__(self, input_ids, scores):
            return scores + 1.0

    user = [hf.TemperatureLogitsWarper(0.5), Shift()]
    options = {"repetition_penalty": 1.2, "temperature": 0.7, "top_k": 3}
    _, hf_processors = hf_generate_step(model, {**options, "do_sample": True, "logits_processor": LogitsProcessorList(user)}, seed=0)
    ours = build_processors(model.generation_config, processors=user, prompt_length=6, attention_mask=MASK, **options)
    assert [type(p) for p in ours] == [type(p) for p in hf_processors]
    assert ours[2] is user[0] or user[0] in list(ours)
    assert list(ours).index(user[1]) == list(hf_processors).index(user[1])


def test_plain_function_as_processor():
    def ban_token_1(input_ids, scores):
        return scores.index_fill(1, torch.tensor([1]), float("-inf"))

    tokens = sample_step(torch.tensor([[0.0, 5.0, 1.0]]), processors=[ban_token_1])
    assert tokens.tolist() == [2]


def test_hf_defaults_apply_when_sampling():
    # model.generate(do_sample=True) keeps HF's default top_k=50; so does hfbridge.
    assert [type(p) for p in build_processors(do_sample=True)] == [hf.TopKLogitsWarper]
    assert build_processors(do_sample=True)[0].top_k == 50
    assert list(build_processors(do_sample=True, top_k=0)) == []


@pytest.mark.parametrize(
    "options, do_sample",
    [({}, False), ({"temperature": 0.5}, True), ({"top_k": 5}, True), ({"min_p": 0.1}, True),
     ({"repetition_penalty": 1.2}, False), ({"temperature": 0.5, "do_sample": False}, False),
     ({"do_sample": True}, True)],
)
@pytest.mark.filterwarnings("ignore:`do_sample` is set to `False`")
def test_do_sample_resolution(options, do_sample):
    assert Sampler(**options).do_sample is do_sample


def test_generation_config_do_sample_is_followed_unless_sampling_options_given():
    config = GenerationConfig(do_sample=True, top_k=7)
    assert Sampler(config).do_sample is True
    # transformers 4.x warns when a greedy config carries a sampling option; 5.x accepts it quietly.
    warns = transformers.__version__.startswith("4.")
    with pytest.warns(UserWarning, match="`do_sample` is set to `False`") if warns else contextlib.nullcontext():
        greedy_config = GenerationConfig(top_k=7, do_sample=False)
    assert Sampler(greedy_config, temperature=0.3).do_sample is True


def test_generation_config_is_not_modified():
    config = GenerationConfig(do_sample=True, temperature=0.5, eos_token_id=2)
    before = config.to_dict()
    Sampler(config, top_p=0.9, prompt_length=3, min_new_tokens=2)
    assert config.to_dict() == before


def test_unknown_option_suggests_the_closest():
    with pytest.raises(TypeError) as error:
        build_processors(tmperature=0.7)
    assert str(error.value) == "sample_step() got an unexpected option `tmperature`. Did you mean `temperature`?"


def test_unknown_option_without_suggestion():
    with pytest.raises(TypeError, match=re.escape("sample_step() got an unexpected option `zzz`.")):
        sample_step(torch.zeros(1, 3), zzz=1)


def test_generation_option_the_step_does_not_use():
    with pytest.raises(TypeError, match=re.escape("sample_step() does not use the generation option `num_beams`")):
        sample_step(torch.zeros(1, 3), num_beams=4)


@pytest.mark.parametrize("option", ["min_new_tokens", "max_new_tokens", "begin_suppress_tokens",
                                    "exponential_decay_length_penalty"])
def test_options_that_need_the_prompt_length(option):
    value = {"min_new_tokens": 2, "max_new_tokens": 2, "begin_suppress_tokens": [1],
             "exponential_decay_length_penalty": (1, 1.1)}[option]
    with pytest.raises(ValueError) as error:
        sample_step(torch.zeros(1, 3), eos_token_id=2, **{option: value})
    assert str(error.value) == (
        f"`{option}` depends on how many tokens the prompt had: pass `prompt_length=` "
        "(the prompt's length in tokens, without the generated ones)."
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"top_p": 1.5}, "`top_p`=1.5 is out of range: `top_p` has to be a float > 0 and < 1, but is 1.5"),
        ({"top_k": -2}, "`top_k`=-2 is out of range: `top_k` has to be a strictly positive integer, but is -2"),
        ({"repetition_penalty": -1.0}, "`repetition_penalty`=-1.0 is out of range: `penalty` has to be a strictly positive float, but is -1.0"),
        ({"min_p": 2.0}, "`min_p`=2.0 is out of range: `min_p` has to be a float in the [0, 1] interval, but is 2.0"),
        ({"epsilon_cutoff": -0.1}, "`epsilon_cutoff`=-0.1 is out of range: `epsilon_cutoff` has to be a float > 0 and < 1"),
        ({"no_repeat_ngram_size": -1}, "`no_repeat_ngram_size`=-1 is out of range: `ngram_size` has to be a strictly positive integer"),
    ],
)
def test_out_of_range_values_use_hf_validation(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        sample_step(torch.zeros(1, 3), **options)


def test_generation_config_type_error():
    with pytest.raises(TypeError, match=re.escape("`generation_config` must be a transformers.GenerationConfig, got dict.")):
        sample_step(torch.zeros(1, 3), generation_config={"top_k": 3})


def test_processor_that_is_not_callable():
    with pytest.raises(TypeError, match=re.escape("`processors[1]` must be callable as (input_ids, scores) -> scores, got int.")):
        build_processors(processors=[hf.TemperatureLogitsWarper(0.5), 3])


def test_guidance_scale_without_unconditional_logits_is_refused_with_a_way_out():
    with pytest.raises(ValueError, match=re.escape("`guidance_scale`=2.0 needs the unconditional logits")):
        sample_step(torch.zeros(1, 3), generation_config=GenerationConfig(guidance_scale=2.0))


def test_watermarking_from_a_generation_config():
    from transformers import SynthIDTextWatermarkingConfig, WatermarkingConfig

    config = GenerationConfig(watermarking_config=WatermarkingConfig(bias=50.0))
    green = sample_step(torch.zeros(1, 8), torch.tensor([[3]]), generation_config=config)  # the bias decides
    assert float(build_processors(config)(torch.tensor([[3]]), torch.zeros(1, 8))[0, int(green)]) == 50.0
    synthid = GenerationConfig(watermarking_config=SynthIDTextWatermarkingConfig(ngram_len=3, keys=[1, 2]))
    with pytest.raises(ValueError, match=re.escape("sample_step() cannot apply a SynthIDTextWatermarkingConfig")):
        sample_step(torch.zeros(1, 3), generation_config=synthid)


def test_max_new_tokens_alone_gives_no_length_warning(caplog):
    with caplog.at_level("WARNING"):
        build_processors(prompt_length=4, max_new_tokens=3, forced_eos_token_id=2)
    assert "seem to have been set" not in caplog.text


def test_sampler_from_prepared_config_equals_sampler():
    from hfbridge._step.plan.build_processors import make_generation_config

    config = make_generation_config(temperature=0.5, top_p=0.8, repetition_penalty=1.1)
    before = config.to_dict()
    ours = Sampler.from_prepared(config)
    assert config.to_dict() == before
    assert describe(ours.processors) == describe(Sampler(temperature=0.5, top_p=0.8, repetition_penalty=1.1).processors)
