"""What each request should give, computed without vLLM: transformers' `model.generate` for HF's options,
`hfbridge.generate` for hfbridge's samplers, on the same weights as the engine's."""

from __future__ import annotations

import torch

import hfbridge

from _tiny_llama import EOS

NEW = 12  # tokens per request

# Greedy requests: HF's options (compared with transformers' own generate) ...
HF_GREEDY = [
    {"repetition_penalty": 1.5},
    {"no_repeat_ngram_size": 2},
    {"sequence_bias": [[[48], 4.0], [[86, 48], -9.0]]},
    {"bad_words_ids": [[48], [39, 86]]},
    {"suppress_tokens": [13, 48, 86]},
    {"min_new_tokens": 6},
    {"begin_suppress_tokens": [73, 38, 45, 40]},
    {"exponential_decay_length_penalty": [2, 1.6]},
    {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3, "renormalize_logits": True},
]
# ... and hfbridge's samplers (compared with hfbridge's generate, which runs them on HF's model)
COMMUNITY_GREEDY = [
    {"dry_multiplier": 0.8, "dry_allowed_length": 1, "dry_sequence_breakers": [[3]]},
    {"dry_multiplier": 1.0, "dry_allowed_length": 1},  # string breakers: the worker loads the tokenizer
    {"presence_penalty": 1.5, "frequency_penalty": 0.5},
    {"presence_penalty": 1.0, "penalty_last_n": 4, "repetition_penalty": 1.2},
]


def hf_tokens(model, prompt: list[int], options: dict, tokenizer=None) -> list[int]:
    """Greedy tokens after `prompt`: transformers' generate, or hfbridge's for hfbridge's options."""
    ids = torch.tensor([prompt])
    if options in COMMUNITY_GREEDY:
        out = hfbridge.generate(model, ids, max_new_tokens=NEW, do_sample=False, eos_token_id=EOS,
                                tokenizer=tokenizer, **options)
    else:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=EOS, pad_token_id=EOS,
                                 **{k: (v if k != "exponential_decay_length_penalty" else tuple(v))
                                    for k, v in options.items()})
    return out[0, len(prompt):].tolist()


def raw_logits(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """`(len(generated), vocab)` the model's logits before each generated token."""
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = model(ids).logits[0]  # [T, V]
    return logits[len(prompt) - 1: len(prompt) - 1 + len(generated)]
