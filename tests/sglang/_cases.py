"""The requests the SGLang tests run, and what hfbridge.generate gives for each."""

from __future__ import annotations

import torch

from hfbridge import generate

V = 40
EOS = 2

PROMPTS = [[5, 6, 7, 5, 6], [9, 3], [5, 6, 7, 5, 6, 7, 8, 9], [11, 12, 13]]
GREEDY = [
    {"repetition_penalty": 1.4, "no_repeat_ngram_size": 2},
    {"dry_multiplier": 0.8, "dry_allowed_length": 1, "dry_sequence_breakers": [[7]]},
    {"min_new_tokens": 4, "suppress_tokens": [4], "presence_penalty": 0.5},  # counts from the prompt; needs eos
    None,  # no options: untouched
]
SAMPLING = [
    {"temperature": 0.7, "top_k": 12, "min_p": 0.05},
    {"top_n_sigma": 1.0, "frequency_penalty": 0.3, "penalty_last_n": 4},
    {"mirostat": 2, "mirostat_tau": 3.0},  # stateful
    {"dynatemp_range": 0.5, "smoothing_factor": 0.3},
]


def expected(model, prompt, options, *, do_sample, steps, seed=None):
    kwargs = dict(options or {})
    generator = [torch.Generator().manual_seed(seed)] if do_sample else None
    out = generate(model, torch.tensor([prompt]), max_new_tokens=steps, do_sample=do_sample, generator=generator,
                   eos_token_id=EOS, pad_token_id=EOS, **kwargs)
    new = out[0, len(prompt):].tolist()
    return new[: new.index(EOS) + 1] if EOS in new else new
