"""`model.generate(custom_generate=hfbridge.custom_generate)`: transformers' own `generate` decoding with hfbridge.

Every test compares transformers' `model.generate` running hfbridge's callable (or folder) with
`hfbridge.generate(model, ...)` for the same options and seed, on a tiny random HF Llama; plain greedy
and sampling also against HF's own `model.generate`.
"""

from __future__ import annotations

import re

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor, StoppingCriteria, TopKLogitsWarper

import hfbridge
from hfbridge import custom_generate, generate
from hfbridge._hf import custom_generate_inputs as contract
from hfbridge._hf import names

from _tiny_models import char_tokenizer, model_cache

_model = model_cache()
CALLABLE = names.TRANSFORMERS_VERSION >= contract.CALLABLE_KEYWORDS_SINCE
needs_callable = pytest.mark.skipif(not CALLABLE, reason="transformers < 4.57 passes no keyword to a callable")

PROMPTS = torch.tensor([[0, 0, 5, 9, 11], [3, 4, 5, 6, 7]])
MASK = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])


def _both(seed=0, **options):
    """(transformers' generate with hfbridge's callable, hfbridge.generate), same seed, same options."""
    model = _model("llama")
    prompts, mask = PROMPTS.clone(), MASK.clone()
    torch.manual_seed(seed)
    theirs = model.generate(prompts, attention_mask=mask, custom_generate=custom_generate, **options)
    assert torch.equal(prompts, PROMPTS) and torch.equal(mask, MASK)  # never modified
    torch.manual_seed(seed)
    ours = generate(model, PROMPTS, attention_mask=MASK, **options)
    return theirs, ours


@needs_callable
def test_greedy_and_sampling_are_hfs_own_tokens():
    model = _model("llama")
    for options in ({"max_new_tokens": 6}, {"max_new_tokens": 6, "do_sample": True, "top_k": 8, "temperature": 0.8}):
        theirs, ours = _both(**options)
        torch.manual_seed(0)
        plain = model.generate(PROMPTS, attention_mask=MASK, **options)
        assert torch.equal(theirs, ours) and torch.equal(theirs, plain)


@needs_callable
@pytest.mark.parametrize("options", [
    {"dry_multiplier": 0.8, "dry_sequence_breakers": [], "repetition_penalty": 1.2},
    {"do_sample": True, "xtc_probability": 0.5, "xtc_threshold": 0.05, "min_p": 0.05},
    {"do_sample": True, "top_n_sigma": 1.0, "presence_penalty": 0.5},
    {"do_sample": True, "mirostat": 2, "mirostat_tau": 3.0},  # stateful
    {"do_sample": True, "temperature": [0.5, 1.5], "dry_multiplier": [0.8, 0.0], "dry_sequence_breakers": []},
    {"do_sample": True, "fast": True, "top_p": 0.9, "generator": [torch.Generator().manual_seed(i) for i in (1, 2)]},
    {"num_beams": 2, "presence_penalty": 0.3},
    {"num_beams": 3, "num_return_sequences": 2, "dry_multiplier": 0.8, "dry_sequence_breakers": []},
    {"do_sample": True, "num_return_sequences": 3, "top_n_sigma": 1.5},
    {"thinking_start": [5], "thinking_end": [6], "thinking_options": {"do_sample": True, "temperature": 1.5}},
])
def test_hfbridge_options_give_hfbridge_generates_tokens(options):
    if "generator" in options:  # one list per call: the generators advance
        options = dict(options, generator=[torch.Generator().manual_seed(i) for i in (1, 2)])
        model = _model("llama")
        theirs = model.generate(PROMPTS, attention_mask=MASK, custom_generate=custom_generate, max_new_tokens=6,
                                **options)
        options["generator"] = [torch.Generator().manual_seed(i) for i in (1, 2)]
        ours = generate(model, PROMPTS, attention_mask=MASK, max_new_tokens=6, **options)
    else:
        theirs, ours = _both(max_new_tokens=6, **options)
    assert torch.equal(theirs, ours)


@needs_callable
def test_the_options_change_the_tokens():
    """The options reach hfbridge: DRY with a strong penalty gives other tokens than without it."""
    plain, _ = _both(max_new_tokens=10, repetition_penalty=1.0)
    dry, _ = _both(max_new_tokens=10, dry_multiplier=50.0, dry_allowed_length=1, dry_sequence_breakers=[])
    assert not torch.equal(plain, dry)


@needs_callable
def test_return_dict_and_scores():
    theirs, ours = _both(max_new_tokens=4, do_sample=True, dry_multiplier=0.8, dry_sequence_breakers=[],
                         return_dict_in_generate=True, output_scores=True)
    assert torch.equal(theirs.sequences, ours.sequences)
    assert all(torch.equal(a, b) for a, b in zip(theirs.scores, ours.scores, strict=True))


class _Ban(LogitsProcessor):
    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, 7] = -float("inf")
        return scores


class _StopAtFour(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 9, dtype=torch.bool)


@needs_callable
def test_the_callers_processors_and_criteria_go_along():
    model = _model("llama")
    theirs = model.generate(PROMPTS, attention_mask=MASK, custom_generate=custom_generate, max_new_tokens=8,
                            logits_processor=[_Ban()], stopping_criteria=[_StopAtFour()], top_n_sigma=None)
    ours = generate(model, PROMPTS, attention_mask=MASK, max_new_tokens=8, processors=[_Ban()],
                    stopping_criteria=[_StopAtFour()])
    assert torch.equal(theirs, ours) and theirs.shape[1] == 9 and not bool((theirs[:, 5:] == 7).any())


@needs_callable
def test_banned_strings_need_our_tokenizer_keyword():
    tok = char_tokenizer()
    model = _model("llama")
    with pytest.raises(ValueError, match="pass `hfbridge_tokenizer=` to model.generate"):
        model.generate(PROMPTS, attention_mask=MASK, custom_generate=custom_generate, max_new_tokens=4,
                       tokenizer=tok, banned_strings=["ab"])
    strings = ["a", "e", "i", "o"]
    theirs = model.generate(PROMPTS, attention_mask=MASK, custom_generate=custom_generate, max_new_tokens=8,
                            hfbridge_tokenizer=tok, banned_strings=strings)
    ours = generate(model, PROMPTS, attention_mask=MASK, max_new_tokens=8, tokenizer=tok, banned_strings=strings)
    assert torch.equal(theirs, ours)
    assert not any(s in text for text in tok.batch_decode(theirs[:, 5:]) for s in strings)


@needs_callable
def test_a_wrong_option_is_named():
    model = _model("llama")
    with pytest.raises(ValueError, match="dry_multiplierr"):  # transformers': an unused model input
        model.generate(PROMPTS, custom_generate=custom_generate, max_new_tokens=2, dry_multiplierr=0.8)
    with pytest.raises(ValueError, match="`dry_multiplier` must be >= 0"):
        model.generate(PROMPTS, custom_generate=custom_generate, max_new_tokens=2, dry_multiplier=-1.0)
    with pytest.raises(TypeError, match="fast"):
        model.generate(PROMPTS, custom_generate=custom_generate, max_new_tokens=2, fast="yes")
    with pytest.raises(ValueError, match=r"`guidance_scale` \(with `negative_prompt_ids`\) cannot run through"):
        model.generate(PROMPTS, custom_generate=custom_generate, max_new_tokens=2, guidance_scale=1.5)
    with pytest.raises(ValueError, match="`logits_processor` holds a TopKLogitsWarper, which the generation options"):
        model.generate(PROMPTS, custom_generate=custom_generate, max_new_tokens=2, do_sample=True,
                       generation_config=GenerationConfig(top_k=5), logits_processor=[TopKLogitsWarper(3)])
    with pytest.raises(ValueError, match="`prefix_allowed_tokens_fn` cannot run through hfbridge.custom_generate"):
        model.generate(PROMPTS, custom_generate=custom_generate, max_new_tokens=2,
                       prefix_allowed_tokens_fn=lambda batch, ids: [1, 2])


def test_transformers_before_4_57_is_refused_with_the_version(monkeypatch):
    monkeypatch.setattr(names, "TRANSFORMERS_VERSION", (4, 56, 2))
    monkeypatch.setattr(names, "TRANSFORMERS_VERSION_TEXT", "4.56.2")
    with pytest.raises(RuntimeError, match=r"needs transformers >= 4\.57\.0, and 4\.56\.2 is installed"):
        custom_generate(_model("llama"), PROMPTS, generation_config=None)


@pytest.mark.skipif(not (4, 56) <= names.TRANSFORMERS_VERSION[:2] < (4, 57), reason="4.56 only")
def test_transformers_4_56_calls_the_callable_and_gets_the_refusal():
    with pytest.raises(RuntimeError, match=f"and {re.escape(names.TRANSFORMERS_VERSION_TEXT)} is installed"):
        _model("llama").generate(PROMPTS, custom_generate=custom_generate, max_new_tokens=2)


def test_the_signature_names_every_hfbridge_option():
    import inspect

    parameters = inspect.signature(hfbridge.custom_generate).parameters
    assert {"dry_multiplier", "mirostat", "banned_strings", "fast", "generator", "hfbridge_tokenizer",
            "temperature"} <= set(parameters)
    assert not {"streamer", "synced_gpus", "model_kwargs"} & set(parameters)  # `_sample`'s: no keyword of ours


@pytest.mark.skipif(names.TRANSFORMERS_VERSION[:2] < (4, 52), reason="transformers loads a custom_generate folder from 4.52")
def test_the_folder_form_receives_the_tokenizer(tmp_path):
    folder = tmp_path / "custom_generate"
    folder.mkdir()
    (folder / "generate.py").write_text("from hfbridge import custom_generate as generate\n")
    tok = char_tokenizer()
    model = _model("llama")
    strings = ["a", "e"]
    torch.manual_seed(1)
    theirs = model.generate(PROMPTS, attention_mask=MASK, custom_generate=str(tmp_path), trust_remote_code=True,
                            tokenizer=tok, banned_strings=strings, max_new_tokens=8, do_sample=True,
                            xtc_probability=0.5)
    torch.manual_seed(1)
    ours = generate(model, PROMPTS, attention_mask=MASK, tokenizer=tok, banned_strings=strings, max_new_tokens=8,
                    do_sample=True, xtc_probability=0.5)
    assert torch.equal(theirs, ours)


@needs_callable
def test_options_riding_a_generation_config_as_trl_passes_them():
    """TRL's trainers put `generation_kwargs` into a `GenerationConfig` and call `model.generate(**inputs,
    generation_config=...)`: hfbridge's options ride the config as extra attributes."""
    import functools


    model = _model("llama")
    config = GenerationConfig(max_new_tokens=6, do_sample=True, dry_multiplier=0.8, dry_sequence_breakers=[],
                              top_n_sigma=1.0)
    patched = functools.partial(model.generate, custom_generate=custom_generate)  # the docs' recipe
    torch.manual_seed(3)
    theirs = patched(input_ids=PROMPTS, attention_mask=MASK, generation_config=config)
    torch.manual_seed(3)
    ours = generate(model, PROMPTS, attention_mask=MASK, generation_config=config)
    torch.manual_seed(3)
    plain = generate(model, PROMPTS, attention_mask=MASK, max_new_tokens=6, do_sample=True)
    assert torch.equal(theirs, ours) and not torch.equal(theirs, plain)
