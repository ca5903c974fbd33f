"""A model passed directly: fed as HF feeds it or refused loudly, never a wrong token.

The model-inputs contract (a model fed its whole sequence again on top of its cache), stateful models
refused for assisted decoding before any model call, a cache that cannot be cropped, and an inferred
all-zeros attention-mask row.
"""

from __future__ import annotations

import re

import pytest
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from hfbridge import ReturnsCache, TransformersContractError, generate
from hfbridge._hf import model_inputs, names
from hfbridge._models.cache import CacheTypeError, crop_cache
from hfbridge.demo.architectures import build_tiny

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

PROMPT = torch.tensor([[5, 9, 13, 5, 9, 13]])


class _Calls:
    def __init__(self, model):
        self.count = 0
        model.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.count += 1


class ForgetsTheNewLength(LlamaForCausalLM):
    """An override that drops what generate passes and asks the base method for the whole sequence."""

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        kwargs = {key: value for key, value in kwargs.items()
                  if key not in ("next_sequence_length", "cache_position", "is_first_iteration")}
        return super().prepare_inputs_for_generation(input_ids, **kwargs)


def _tiny_gpt2(kind=GPT2LMHeadModel):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=32, n_positions=32, n_embd=16, n_layer=1, n_head=2, bos_token_id=None,
                        eos_token_id=None, pad_token_id=0)
    return kind(config).eval()


@pytest.mark.skipif(names.TRANSFORMERS_MAJOR < 5, reason="transformers 4.x's base method slices by `cache_position`, "
                    "which the prefill needs as well: an override that drops it fails at once")
def test_a_model_fed_its_whole_sequence_again_is_a_contract_error():
    torch.manual_seed(0)
    model = ForgetsTheNewLength(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1, bos_token_id=None,
                                            eos_token_id=None, pad_token_id=0)).eval()
    calls = _Calls(model)
    with pytest.raises(TransformersContractError) as error:
        generate(model, PROMPT, max_new_tokens=4)
    assert error.value.contract == "model-inputs"
    assert f"transformers {transformers.__version__}" in str(error.value)
    assert "ForgetsTheNewLength.prepare_inputs_for_generation" in str(error.value)
    assert "prepared all 7 positions again while the model's cache holds 6 positions" in str(error.value)
    assert calls.count == 1  # the prefill only: no decode step ran


def test_a_release_without_a_slicing_argument_is_a_contract_error(monkeypatch):
    monkeypatch.setattr(model_inputs, "_generate_passes", lambda: frozenset({"is_first_iteration"}))
    with pytest.raises(TransformersContractError, match=re.escape(
            "takes neither `next_sequence_length` (5.x) nor `cache_position` (4.x)")):
        generate(_tiny_gpt2(), PROMPT, max_new_tokens=2)


def test_the_base_method_gets_the_new_length_whatever_the_override_names():
    # the override names none of the protocol (as Phi3, Bamba, Zamba2): generate still slices the new token
    class Plain(GPT2LMHeadModel):
        def prepare_inputs_for_generation(self, input_ids, **kwargs):
            return super().prepare_inputs_for_generation(input_ids, **kwargs)

    model = _tiny_gpt2(Plain)
    fed = []
    model.register_forward_pre_hook(lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[1]),
                                    with_kwargs=True)
    out = generate(model, PROMPT, max_new_tokens=4)
    theirs = model.generate(PROMPT, max_new_tokens=4)
    assert torch.equal(out, theirs)
    assert fed[:4] == [6, 1, 1, 1]


def _mamba():
    return build_tiny("mamba", "MambaForCausalLM")


@pytest.mark.parametrize("extra", ["assistant", "prompt_lookup"])
def test_stateful_models_refused_for_assisted_decoding_before_any_model_call(extra):
    model = _mamba()
    calls = _Calls(model)
    options = {"prompt_lookup_num_tokens": 2} if extra == "prompt_lookup" else {"assistant_model": _mamba()}
    with pytest.raises(ValueError, match=re.escape(
            "assisted generation is not supported with stateful models, such as MambaForCausalLM")):
        generate(model, PROMPT, max_new_tokens=4, **options)
    assert calls.count == 0
    with pytest.raises(ValueError, match="not supported with stateful models"):  # HF's own words
        model.generate(PROMPT, max_new_tokens=4, **options)


@pytest.mark.skipif(not hasattr(transformers.cache_utils.Cache, "is_croppable"),
                    reason="the installed transformers' caches do not say whether they can be cropped")
def test_a_callable_whose_cache_cannot_be_cropped_names_crop_cache():
    hf = _mamba()

    def step(input_ids, cache, attention_mask):
        out = hf(input_ids, cache=cache, use_cache=True)
        return out.logits, out.cache

    with pytest.raises(CacheTypeError, match=r"not croppable.*ReturnsCache\(model, crop_cache=\.\.\.\)"):
        generate(ReturnsCache(step), PROMPT, max_new_tokens=4, prompt_lookup_num_tokens=2)


def test_an_inferred_all_zeros_mask_row_is_refused():
    table = torch.randn(8, 8)
    with pytest.raises(ValueError, match=re.escape(
            "no `attention_mask` was passed, and the one inferred from pad_token_id=0 (every pad token is padding, "
            "as in HF's generate) is all zeros in row 1")):
        generate(lambda ids: table[ids], torch.tensor([[3, 4], [0, 0]]), max_new_tokens=2, pad_token_id=0,
                 eos_token_id=1)
    # with the mask passed, a prompt of pad tokens is the caller's choice
    out = generate(lambda ids: table[ids], torch.tensor([[0]]), attention_mask=torch.ones(1, 1, dtype=torch.long),
                   max_new_tokens=2, pad_token_id=0, eos_token_id=1)
    assert out.shape[1] >= 2


def _cached_gpt2_step(hf):
    def step(input_ids, cache, attention_mask):
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1]:]
        out = hf(input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                 **{names.OUTPUT_CACHE: cache})
        return out.logits, getattr(out, names.OUTPUT_CACHE)
    return step


PADDED = torch.tensor([[5, 9, 13, 2], [0, 0, 3, 4]])
PADDED_MASK = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])


def test_a_step_wrapped_with_functools_wraps_keeps_left_padding():
    import functools

    hf = _tiny_gpt2()
    step = _cached_gpt2_step(hf)

    @functools.wraps(step)
    def logged(*args, **kwargs):
        return step(*args, **kwargs)

    expected = hf.generate(PADDED, attention_mask=PADDED_MASK, max_new_tokens=5)
    assert torch.equal(generate(ReturnsCache(logged), PADDED, attention_mask=PADDED_MASK, max_new_tokens=5),
                       expected)


def test_a_step_whose_signature_cannot_tell_is_refused_on_padding_or_told():
    hf = _tiny_gpt2()
    step = _cached_gpt2_step(hf)

    def opaque(*args, **kwargs):  # a decorator without functools.wraps
        return step(*args, **kwargs)

    with pytest.raises(ValueError, match=re.escape("pass ReturnsCache(model, attention_mask=True)")):
        generate(ReturnsCache(opaque), PADDED, attention_mask=PADDED_MASK, max_new_tokens=5)
    expected = hf.generate(PADDED, attention_mask=PADDED_MASK, max_new_tokens=5)
    assert torch.equal(generate(ReturnsCache(opaque, attention_mask=True), PADDED, attention_mask=PADDED_MASK,
                                max_new_tokens=5), expected)
    with pytest.raises(TypeError, match="`attention_mask` must be True, False or None, got str"):
        ReturnsCache(opaque, attention_mask="yes")


def test_hooks_tell_crop_state_how_many_positions_were_fed():
    from hfbridge import Hooks

    hf = _tiny_gpt2()
    name = names.OUTPUT_CACHE
    seen = []

    def prepare(input_ids, attention_mask=None, fed=0, **state):
        return {"input_ids": input_ids[:, fed:], name: state.get(name), "use_cache": True}

    def update(outputs, state):
        return {**state, name: getattr(outputs, name), "fed": state["fed_next"]}

    def forward_fed(state, length, fed):
        seen.append((length, fed))
        state = {**state, name: crop_cache(state[name], length, cached=fed)}
        return {**state, "fed": length}

    class Counted(Hooks):
        def forward(self, input_ids, state):
            state["fed_next"] = input_ids.shape[1]
            return super().forward(input_ids, state)

    adapter = Counted(hf, lambda input_ids, **state: prepare(input_ids, **{k: v for k, v in state.items()
                                                                           if k != "fed_next"}),
                      update, crop_state=forward_fed)
    prompt = torch.tensor([[3, 4, 5, 3, 4, 5, 3, 4]])
    options = dict(max_new_tokens=6, prompt_lookup_num_tokens=2, eos_token_id=31)  # 4.x's lookup needs an eos
    expected = hf.generate(prompt, **options)
    assert torch.equal(generate(adapter, prompt, fed=0, **options), expected)
    assert seen and all(fed >= length for length, fed in seen)
    assert adapter.fed > 0


def test_a_class_with_its_own_generate_is_refused_before_any_model_call():
    model = build_tiny("musicgen", "MusicgenForCausalLM")
    calls = _Calls(model)
    with pytest.raises(TypeError, match=re.escape(
            "MusicgenForCausalLM has a generate of its own (MusicgenForCausalLM.generate), which decodes differently")):
        generate(model, PROMPT, max_new_tokens=2)
    assert calls.count == 0


def test_a_recurrent_state_whose_axis_only_looks_like_the_sequence_is_not_cropped():
    # the state is [B, 1, 8, 4]: its second-to-last axis equals the positions the first call sees (6 prompt
    # tokens and 2 drafts), but it never grows; hfbridge stops once a call shows that axis is not the sequence
    torch.manual_seed(0)
    table = torch.randn(16, 16)

    def step(input_ids, cache):
        state = torch.zeros(input_ids.shape[0], 1, 8, 4) if cache is None else cache + 1
        return table[input_ids], state

    with pytest.raises(CacheTypeError, match=r"cache \(shape \(1, 1, \d+, 4\) -> \(1, 1, \d+, 4\)\) did not grow along "
                                             r"its second-to-last axis by the positions fed"):
        generate(ReturnsCache(step), torch.tensor([[3, 4, 3, 4, 3, 4]]), max_new_tokens=8,
                 prompt_lookup_num_tokens=2, eos_token_id=15)


@pytest.mark.skipif(not hasattr(transformers.cache_utils.DynamicCache, "activate_past_recording"),
                    reason="the installed transformers' sliding-window caches keep every position")
def test_a_sliding_window_cache_in_a_callable_needs_past_recording_for_prompt_lookup():
    from transformers import MistralConfig, MistralForCausalLM
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(0)
    hf = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, sliding_window=4,
                                          max_position_embeddings=64)).eval()

    def stepper(record):
        def step(input_ids, cache, attention_mask):
            if cache is None:
                cache = DynamicCache(config=hf.config)
                if record:
                    cache.activate_past_recording()  # as HF's assisted loop does on its own cache
            out = hf(input_ids, attention_mask=attention_mask, cache=cache, use_cache=True)
            return out.logits, out.cache
        return ReturnsCache(step)

    prompt = torch.tensor([[3, 4, 5, 3, 4, 5, 3, 4]])
    options = dict(max_new_tokens=8, prompt_lookup_num_tokens=2, eos_token_id=63, pad_token_id=0)
    with pytest.raises(CacheTypeError, match=re.escape("call cache.activate_past_recording() on the cache your step "
                                                       "creates, before its first forward")):
        generate(stepper(record=False), prompt, **options)
    assert torch.equal(generate(stepper(record=True), prompt, **options), hf.generate(prompt, **options))
