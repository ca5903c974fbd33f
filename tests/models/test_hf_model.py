"""An HF `PreTrainedModel` passed straight to `generate` behaves as its own `model.generate` (`HFModel`).

Parity of tokens with `model.generate` (greedy, sampled, beams, assisted, prompt lookup; B=1 and
left-padded B=3), the model's `generation_config` as the defaults, and the model calls themselves:
the prompt once, then one new token per call, exactly as many calls as HF's own `generate` makes.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from transformers import GenerationConfig

from hfbridge import Recompute, generate
from hfbridge._models.choose import as_adapter
from hfbridge._models.hf_model import HFModel

from _tiny_models import VOCAB, model_cache, tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf")

_model = model_cache()

PROMPTS = torch.tensor([[0, 0, 7, 3, 9, 11], [0, 5, 8, 2, 4, 6], [12, 30, 7, 21, 3, 17]])  # [3, 6]
MASK = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])


def _both(hf, input_ids, seed=0, **options):
    """(hfbridge's, HF's) result for the same options and the same global seed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        theirs = hf.generate(input_ids, **options)
        torch.manual_seed(seed)
        ours = generate(hf, input_ids, **options)
    return ours, theirs


def _batch(rows):
    if rows == 1:
        return {"input_ids": PROMPTS[2:], "attention_mask": MASK[2:]}
    return {"input_ids": PROMPTS, "attention_mask": MASK}


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_same_tokens_as_model_generate(name, sample, rows):
    batch = _batch(rows)
    ours, theirs = _both(_model(name), batch["input_ids"], seed=3, attention_mask=batch["attention_mask"],
                         max_new_tokens=12, do_sample=sample, pad_token_id=0)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("options", [{"num_beams": 3}, {"num_beams": 2, "do_sample": True},
                                     {"num_beams": 3, "num_return_sequences": 2}],
                         ids=["beams", "beam-sampling", "two-returned"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_beams_same_as_model_generate(name, options):
    ours, theirs = _both(_model(name), PROMPTS, seed=1, attention_mask=MASK, max_new_tokens=6, pad_token_id=0,
                         **options)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("strategy", ["prompt_lookup", "assistant"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_assisted_same_as_model_generate(name, strategy):
    hf = _model(name)
    prompt = torch.tensor([[3, 4, 5, 3, 4, 5, 3, 4]])
    extra = {"prompt_lookup_num_tokens": 2} if strategy == "prompt_lookup" else {"assistant_model": _model(name)}
    ours, theirs = _both(hf, prompt, max_new_tokens=8, eos_token_id=VOCAB - 1, pad_token_id=0, **extra)
    assert torch.equal(ours, theirs)


def test_more_options_same_as_model_generate():
    hf = _model("llama")
    prompt = torch.tensor([[3, 4, 5, 3, 4, 5, 3]])
    cases = [dict(prompt_lookup_num_tokens=2, repetition_penalty=1.3, eos_token_id=VOCAB - 1, pad_token_id=0),
             dict(do_sample=True, num_return_sequences=3, top_p=0.8, pad_token_id=0),
             dict(do_sample=True, eos_token_id=[5, 7], pad_token_id=0, min_new_tokens=2)]
    for options in cases:
        ours, theirs = _both(hf, prompt, seed=2, max_new_tokens=8, **options)
        assert torch.equal(ours, theirs), options
    ours, theirs = _both(hf, PROMPTS, seed=2, attention_mask=MASK, max_new_tokens=5, do_sample=True, pad_token_id=0,
                         return_dict_in_generate=True, output_scores=True, output_logits=True)
    assert torch.equal(ours.sequences, theirs.sequences)
    for field in ("scores", "logits"):
        for mine, hfs in zip(getattr(ours, field), getattr(theirs, field), strict=True):
            torch.testing.assert_close(mine, hfs)


class _Calls:
    """The `input_ids` shape of every forward call of a model, from a forward pre-hook."""

    def __init__(self, model):
        self.shapes: list[tuple[int, ...]] = []
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.shapes.append(tuple(ids.shape))

    def take(self):
        shapes, self.shapes = self.shapes, []
        return shapes


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_one_call_per_new_token_after_the_prefill(name):
    hf = _model(name)
    calls = _Calls(hf)
    try:
        ours, theirs = None, None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = hf.generate(PROMPTS, attention_mask=MASK, max_new_tokens=9, pad_token_id=0)
            hf_calls = calls.take()
            ours = generate(hf, PROMPTS, attention_mask=MASK, max_new_tokens=9, pad_token_id=0)
            our_calls = calls.take()
    finally:
        calls.handle.remove()
    assert torch.equal(ours, theirs)
    assert our_calls == hf_calls == [(3, 6)] + [(3, 1)] * 8  # the prompt, then only the new token


def test_an_explicit_adapter_still_wins():
    hf = _model("gpt2")
    assert isinstance(as_adapter(hf), HFModel)
    assert isinstance(as_adapter(hf, max_context=4), Recompute)
    calls = _Calls(hf)
    try:
        generate(Recompute(hf), PROMPTS[2:], max_new_tokens=3)
    finally:
        calls.handle.remove()
    assert calls.shapes == [(1, 6), (1, 7), (1, 8)]  # Recompute feeds the whole sequence, as asked


def _llama_with(**generation):
    model = tiny_llama()
    model.generation_config = GenerationConfig(**generation)
    return model


def test_eos_and_pad_from_the_models_generation_config():
    plain = _model("llama")
    free = generate(plain, PROMPTS, attention_mask=MASK, max_new_tokens=10, pad_token_id=0)
    eos = int(free[2, PROMPTS.shape[1] + 2])  # the third token the last row generates
    model = _llama_with(eos_token_id=eos, pad_token_id=1)
    ours, theirs = _both(model, PROMPTS, attention_mask=MASK, max_new_tokens=10)
    assert torch.equal(ours, theirs)
    assert int(ours[2, PROMPTS.shape[1] + 2]) == eos and bool((ours[2, PROMPTS.shape[1] + 3:] == 1).all())
    if bool((ours == eos).any(dim=1).all()):
        assert ours.shape[1] < free.shape[1]  # every row stopped at eos


def test_sampling_defaults_and_lengths_from_the_models_generation_config():
    model = _llama_with(do_sample=True, temperature=0.7, top_k=5, max_new_tokens=7)
    ours, theirs = _both(model, PROMPTS, seed=11, attention_mask=MASK, pad_token_id=0)
    assert torch.equal(ours, theirs) and ours.shape[1] == PROMPTS.shape[1] + 7
    greedy = generate(_model("llama"), PROMPTS, attention_mask=MASK, max_new_tokens=7, pad_token_id=0)
    assert not torch.equal(ours, greedy)


def test_the_callers_options_override_the_models_generation_config():
    model = _llama_with(do_sample=True, temperature=0.7, max_new_tokens=7)
    ours, theirs = _both(model, PROMPTS, attention_mask=MASK, pad_token_id=0, do_sample=False, max_new_tokens=4)
    assert torch.equal(ours, theirs) and ours.shape[1] == PROMPTS.shape[1] + 4
    assert torch.equal(ours, generate(_model("llama"), PROMPTS, attention_mask=MASK, max_new_tokens=4,
                                      pad_token_id=0))
    config = GenerationConfig(max_new_tokens=3, do_sample=False, pad_token_id=0)
    ours, theirs = _both(model, PROMPTS, attention_mask=MASK, generation_config=config)
    assert torch.equal(ours, theirs) and ours.shape[1] == PROMPTS.shape[1] + 3


def test_without_cache_every_call_feeds_the_whole_sequence():
    hf = _model("llama")
    calls = _Calls(hf)
    try:
        ours, theirs = _both(hf, PROMPTS[2:], max_new_tokens=3, use_cache=False)
    finally:
        calls.handle.remove()
    assert torch.equal(ours, theirs)
    assert calls.shapes == [(1, 6), (1, 7), (1, 8)] * 2


def test_returned_cache_and_untouched_inputs():
    hf = _model("gpt2")
    prompts, mask = PROMPTS.clone(), MASK.clone()
    out = generate(hf, prompts, attention_mask=mask, max_new_tokens=4, pad_token_id=0, return_dict_in_generate=True)
    assert torch.equal(prompts, PROMPTS) and torch.equal(mask, MASK)
    cache = out.past_key_values
    length = cache.get_seq_length() if hasattr(cache, "get_seq_length") else cache[0][0].shape[-2]
    assert length == PROMPTS.shape[1] + 3  # the last token is never fed


def test_refused_models_and_inputs():
    with pytest.raises(TypeError, match=re.escape("HFModel takes a transformers PreTrainedModel with "
                                                  "prepare_inputs_for_generation, got function;")):
        HFModel(lambda ids: ids)
    with pytest.raises(TypeError, match="supplies `past_key_values` itself"):
        generate(_model("gpt2"), PROMPTS, attention_mask=MASK, max_new_tokens=2, past_key_values=None)


# Other architectures: a sliding window (Mistral), ALiBi without position ids (Bloom), learned positions
# offset by HF (OPT), a state cache under another name (Mamba's `cache_params`).
ARCHITECTURES = {
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                            num_attention_heads=4, num_key_value_heads=2,
                                                            max_position_embeddings=64, sliding_window=4)),
    "bloom": ("BloomForCausalLM", "BloomConfig", dict(hidden_size=32, n_layer=2, n_head=4)),
    "opt": ("OPTForCausalLM", "OPTConfig", dict(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                                                max_position_embeddings=64, word_embed_proj_dim=32)),
    "mamba": ("MambaForCausalLM", "MambaConfig", dict(hidden_size=32, state_size=4, num_hidden_layers=2, expand=2,
                                                      conv_kernel=2)),
}
ARCHITECTURE_OPTIONS = {"greedy": {}, "sampled": {"do_sample": True}, "beams": {"num_beams": 3},
                        "prompt_lookup": {"prompt_lookup_num_tokens": 2}}


@pytest.mark.parametrize("strategy", list(ARCHITECTURE_OPTIONS))
@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_other_architectures(architecture, strategy):
    import transformers

    if architecture == "mamba" and strategy in ("beams", "prompt_lookup"):
        pytest.skip("transformers' own beam search and assisted decoding do not follow a Mamba cache on every version")
    model_class, config_class, sizes = ARCHITECTURES[architecture]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(vocab_size=64, bos_token_id=1, eos_token_id=2, pad_token_id=0, **sizes)
    model = getattr(transformers, model_class)(config).eval()
    rows = 1 if strategy == "prompt_lookup" else 2
    ours, theirs = _both(model, PROMPTS[1:1 + rows], seed=4, attention_mask=MASK[1:1 + rows], max_new_tokens=8,
                         **ARCHITECTURE_OPTIONS[strategy])
    assert torch.equal(ours, theirs)
