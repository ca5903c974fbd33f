"""`generate` where the new samplers meet the older features: each HF's answer or the list-valued call's.

A sampler option carried by a `GenerationConfig` (the call's or the model's own) without
`do_sample` leaves the call greedy, as HF's own options there do; NumPy arrays of strings
(`sampler_order`, `dry_sequence_breakers`) read as the lists they hold.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from _banned_reference import pieces_tokenizer
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

from hfbridge import Recompute, generate

from _tiny_models import model_cache

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

_model = model_cache()
PROMPT = torch.tensor([[5, 7, 9, 11], [3, 4, 5, 6]])
TOKENIZER = pieces_tokenizer(48)


def _hf_greedy(hf, config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), generation_config=config)


@pytest.mark.parametrize("option", [{"mirostat": 1}, {"mirostat": 2}, {"top_n_sigma": 1.0}, {"adaptive_target": 0.4}])
def test_a_sampler_option_in_the_calls_config_without_do_sample_is_greedy_as_hf(option):
    hf = _model("gpt2")
    config = GenerationConfig(max_new_tokens=6, **option)
    expected = _hf_greedy(hf, copy.deepcopy(config))  # HF: do_sample unset is greedy
    out = generate(hf, PROMPT, generation_config=config, generator=torch.Generator().manual_seed(0))
    assert out.tolist() == expected.tolist()


@pytest.mark.parametrize("option", [{"mirostat": 1}, {"top_n_sigma": 1.0}])
def test_a_sampler_option_in_the_models_config_without_do_sample_is_greedy_as_hf(option):
    hf = _model("gpt2")
    saved = copy.deepcopy(hf.generation_config)
    try:
        for name, value in option.items():
            setattr(hf.generation_config, name, value)
        expected = _hf_greedy(hf, GenerationConfig(max_new_tokens=6))
        out = generate(hf, PROMPT, max_new_tokens=6, generator=torch.Generator().manual_seed(0))
    finally:
        hf.generation_config = saved
    assert out.tolist() == expected.tolist()


TABLE = torch.randn(48, 48, generator=torch.Generator().manual_seed(0)) * 2


@pytest.mark.parametrize(("numpy_options", "list_options"), [
    ({"sampler_order": np.array(["top_k", "temperature"]), "top_k": 3},
     {"sampler_order": ["top_k", "temperature"], "top_k": 3}),
    ({"dry_multiplier": 0.8, "dry_sequence_breakers": np.array(["a", "b"])},
     {"dry_multiplier": 0.8, "dry_sequence_breakers": ["a", "b"]}),
])
def test_numpy_arrays_of_strings_are_the_lists_they_hold(numpy_options, list_options):
    model = Recompute(lambda input_ids: TABLE[input_ids])
    runs = [generate(model, PROMPT, max_new_tokens=6, do_sample=True, tokenizer=TOKENIZER,
                     generator=torch.Generator().manual_seed(0), **options) for options in (numpy_options, list_options)]
    assert runs[0].tolist() == runs[1].tolist()


def test_mirostat_in_the_models_own_config_turns_hfs_default_top_k_off_as_a_keyword_does():
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=200, n_positions=32, n_embd=16, n_layer=1, n_head=2,
                                    bos_token_id=None, eos_token_id=None)).eval()  # more tokens than top_k=50
    prompt = PROMPT[:1]
    expected = generate(hf, prompt, max_new_tokens=8, do_sample=True, top_k=0, mirostat=2, mirostat_tau=9.0,
                        generator=torch.Generator().manual_seed(0))
    with_top_k = generate(hf, prompt, max_new_tokens=8, do_sample=True, top_k=50, mirostat=2, mirostat_tau=9.0,
                          generator=torch.Generator().manual_seed(0))
    assert expected.tolist() != with_top_k.tolist()  # the seed tells the two apart
    hf.generation_config.do_sample, hf.generation_config.mirostat, hf.generation_config.mirostat_tau = True, 2, 9.0
    out = generate(hf, prompt, max_new_tokens=8, generator=torch.Generator().manual_seed(0))
    assert out.tolist() == expected.tolist()
    hf.generation_config.top_k = 40  # the model's own top_k is kept, as a passed one
    out = generate(hf, prompt, max_new_tokens=8, generator=torch.Generator().manual_seed(0))
    assert out.tolist() == generate(hf, prompt, max_new_tokens=8, do_sample=True, top_k=40, mirostat=2,
                                    mirostat_tau=9.0, generator=torch.Generator().manual_seed(0)).tolist()


def test_banned_strings_with_a_recurrent_cache_are_refused_at_the_first_step_not_the_first_ban():
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    mamba = MambaForCausalLM(MambaConfig(vocab_size=48, hidden_size=16, num_hidden_layers=1, state_size=4,
                                         bos_token_id=None, eos_token_id=None, pad_token_id=None)).eval()
    # "x" is never generated: no rollback ever happens, yet the cache could not roll one back
    # transformers 5 names an HF cache that says it is not croppable; 4.x's MambaCache is no HF Cache at all
    with pytest.raises(TypeError, match=r"cannot drop positions from the model's `(cache|cache_params)`, a "
                                        r"(DynamicCache that says it is not croppable .* or banned strings|MambaCache)"):
        generate(mamba, PROMPT, max_new_tokens=3, banned_strings=["x"], tokenizer=TOKENIZER)
