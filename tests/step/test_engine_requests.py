"""A serving engine's request options read the registry's rows: which options a request may carry (`request`),
why the others are refused (`request_refused`, worded for each engine), which take a list (`list_value`). Pinned to
what vLLM's and SGLang's requests took when these were tables of names (`hfbridge/_step/plan/engine_requests.py`); the
engines' own tests (`tests/vllm`, `tests/sglang`) run the requests end to end."""

import re
from types import SimpleNamespace

import pytest
from transformers import GenerationConfig

from hfbridge._step.plan.engine_requests import Engine, accepted_names, check_options
from hfbridge._step.plan.option_table import community_rows
from hfbridge.sglang._custom_params import check_params
from hfbridge.vllm._sampling_params import check_request

# HF's options a request took, as the hand-written table had them (`top_h` where transformers has it)
HF_TAKEN = {"repetition_penalty", "no_repeat_ngram_size", "sequence_bias", "bad_words_ids", "suppress_tokens",
            "begin_suppress_tokens", "min_new_tokens", "min_length", "exponential_decay_length_penalty",
            "eos_token_id", "remove_invalid_values", "renormalize_logits", "temperature", "top_k", "top_p", "min_p",
            "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h"}
LISTS = {"sequence_bias": [[[1, 2], 0.5]], "bad_words_ids": [[3, 4]], "suppress_tokens": [5, 6],
         "begin_suppress_tokens": [5], "eos_token_id": [0, 1], "exponential_decay_length_penalty": [4, 1.5],
         "dry_sequence_breakers": [[7, 8]], "thinking_start": [9], "thinking_end": [10],
         "thinking_budget_message": [11], "sampler_order": ["top_k", "temperature"]}
_BUDGET = {"thinking_budget": 4, "thinking_start": [9], "thinking_end": [10]}  # the tags as ids: no tokenizer
SWITCHES = {"dry_sequence_breakers": {"dry_multiplier": 0.8}, "thinking_start": _BUDGET, "thinking_end": _BUDGET,
            "thinking_budget_message": _BUDGET}

VLLM_REFUSED = {
    "do_sample": "vLLM's `SamplingParams.temperature` decides: 0 is greedy, 1 samples from hfbridge's scores",
    "max_new_tokens": "vLLM's `SamplingParams.max_tokens` ends the request",
    "max_length": "vLLM's `SamplingParams.max_tokens` ends the request",
    "forced_eos_token_id": "it needs HF's `max_length`; vLLM's `SamplingParams.max_tokens` ends the request",
    "forced_bos_token_id": "it applies at the first position of encoder-decoder outputs only",
    "guidance_scale": "classifier-free guidance needs a second model call per step, which vLLM does not make",
    "watermarking_config": "watermarking is not offered inside vLLM",
    "thinking_options": "vLLM's processor runs one chain per request, not one per phase, yet",
}
SGLANG_REFUSED = {
    "do_sample": "SGLang's `temperature` decides: 0 is greedy, 1 samples from hfbridge's scores",
    "max_new_tokens": "SGLang's `max_new_tokens` ends the request",
    "max_length": "SGLang's `max_new_tokens` ends the request",
    "forced_eos_token_id": "it needs HF's `max_length`; SGLang's `max_new_tokens` ends the request",
    "forced_bos_token_id": "it applies at the first position of encoder-decoder outputs only",
    "guidance_scale": "classifier-free guidance needs a second model call per step, which SGLang does not make",
    "watermarking_config": "watermarking is not offered inside SGLang",
}


def _vllm(options, temperature=1.0):
    return check_request(SimpleNamespace(extra_args={"hfbridge": options}, temperature=temperature, top_k=0,
                                         top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                                         frequency_penalty=0.0))


def _sglang(options, temperature=1.0):
    return check_params(options, SimpleNamespace(temperature=temperature, top_k=1 << 30, top_p=1.0, min_p=0.0,
                                                 repetition_penalty=1.0, presence_penalty=0.0,
                                                 frequency_penalty=0.0, min_new_tokens=0))


def test_the_options_a_request_takes():
    hf = {name for name in HF_TAKEN if hasattr(GenerationConfig(), name)}
    assert accepted_names() == hf | set(community_rows())


@pytest.mark.parametrize(("check", "refused"), [(_vllm, VLLM_REFUSED), (_sglang, SGLANG_REFUSED)])
def test_refusals_are_worded_for_the_engine(check, refused):
    engine = "vLLM" if check is _vllm else "SGLang"
    for name, why in refused.items():
        with pytest.raises(ValueError, match=f"^{re.escape(f'`{name}` is not taken in {engine}: {why}.')}$"):
            check({name: 1})


@pytest.mark.parametrize("check", [_vllm, _sglang])
def test_lists_where_the_value_is_a_list(check):
    for name, value in LISTS.items():
        options = {name: value, **SWITCHES.get(name, {})}  # a tuning option with the option that switches it on
        assert check(options).options == options
    engine = "vLLM" if check is _vllm else "SGLang"
    for name in sorted(accepted_names() - set(LISTS)):
        with pytest.raises(TypeError, match=f"^`{name}` takes one value per request, got a list "
                                            rf"\[1, 2\]: each {engine} request is one row"):
            check({name: [1, 2]})


def test_an_engine_without_fields_of_its_own():
    engine = Engine(name="Mine", where="`options`", refused={"top_k": "Mine has its own"})
    assert engine.refusal("top_k") == "Mine has its own"
    assert engine.refusal("max_new_tokens") == "the engine's length limit ends the request"
    assert engine.refusal("top_p") is None
    with pytest.raises(ValueError, match=r"^`do_sample` is not taken in Mine: the engine's `temperature` decides"):
        check_options({"do_sample": True}, do_sample=True, engine=engine)
