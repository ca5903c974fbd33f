"""A new host (the step for another engine) is one module: the request's options checked, described and built by
`hfbridge/_step/plan/engine_requests.py` (`Engine`, `check_options`, `build_sampler`), each call one
`Sampler.process`; its import rule is one row of `tests/test_architecture.py`'s wing table. The host here is an
example written for this test: llama-cpp-python's logits processor (`(input_ids, scores) -> scores`, 1-D NumPy
arrays, one sequence per call; llama.cpp samples from what it returns). This module is its "new module"; the loop
below is the one llama-cpp-python runs, greedy, and gives `generate`'s tokens for the same options."""

import numpy as np
import pytest
import torch

from hfbridge import generate
from hfbridge._step.plan.engine_requests import Engine, build_sampler, check_options

LLAMA_CPP = Engine(name="llama-cpp-python", where="the processor's options",
                   refused={"max_new_tokens": "llama.cpp's `max_tokens` ends the completion"},
                   greedy_fix="pass do_sample=True (and llama.cpp's temperature=1.0)")


class LlamaCppProcessor:
    """hfbridge's options as one llama-cpp-python logits processor; a history that does not grow starts afresh."""

    def __init__(self, *, do_sample=True, **options):
        self.request = check_options(options, do_sample=do_sample, engine=LLAMA_CPP)
        self.sampler, self.length = None, 0

    def __call__(self, input_ids, scores):
        if self.sampler is None or len(input_ids) <= self.length:  # a new completion
            prompt = len(input_ids) if self.request.counts_from_prompt else None
            self.sampler = build_sampler(self.request, prompt_length=prompt, eos_token_id=None, tokenizer=None,
                                         generator=None)
        self.length = len(input_ids)
        ids = torch.from_numpy(np.asarray(input_ids, dtype=np.int64))[None]  # [1, T]
        return self.sampler.process(ids, torch.tensor(scores, dtype=torch.float32)[None])[0].numpy()  # [V]


TABLE = torch.randn(32, 32, generator=torch.Generator().manual_seed(0))  # a bigram "model"
TABLE[torch.arange(4), (torch.arange(4) + 1) % 4] += 4.0  # that loops 0 -> 1 -> 2 -> 3 -> 0 when greedy


def llama_loop(prompt, processor, new):
    """llama-cpp-python's loop, greedy: the last position's scores, the processor, the argmax."""
    ids = np.array(prompt, dtype=np.intc)
    for _ in range(new):
        scores = TABLE[int(ids[-1])].numpy().astype(np.single)
        ids = np.append(ids, np.intc(int(np.argmax(processor(ids, scores)))))
    return ids.tolist()


@pytest.mark.parametrize("options", [dict(repetition_penalty=3.0), dict(no_repeat_ngram_size=2),
                                     dict(dry_multiplier=2.0, dry_allowed_length=1, dry_sequence_breakers=[]),
                                     dict(min_new_tokens=3, eos_token_id=1)])
def test_the_engines_loop_gives_generates_tokens(options):
    processor = LlamaCppProcessor(do_sample=False, **options)
    ours = generate(lambda ids: TABLE[ids], torch.tensor([[1, 2, 3]]), max_new_tokens=8, **options)[0].tolist()
    plain = generate(lambda ids: TABLE[ids], torch.tensor([[1, 2, 3]]), max_new_tokens=8)[0].tolist()
    assert ours != plain  # the options change the tokens
    assert llama_loop([1, 2, 3], processor, 8)[:len(ours)] == ours  # (llama.cpp stops at eos itself)
    assert llama_loop([1, 2, 3], processor, 8)[:len(ours)] == ours  # a second completion starts afresh


def test_the_shared_checks_name_the_engine_and_the_option():
    with pytest.raises(ValueError, match="`top_kk` is not an hfbridge option llama-cpp-python requests take. "
                                         "Did you mean `top_k`?"):
        LlamaCppProcessor(top_kk=3)
    with pytest.raises(ValueError, match="`max_new_tokens` is not taken in llama-cpp-python: llama.cpp's"):
        LlamaCppProcessor(max_new_tokens=3)
    with pytest.raises(ValueError, match="`top_p` applies only when sampling, and the request is greedy; pass "
                                         "do_sample=True"):
        LlamaCppProcessor(top_p=0.9, do_sample=False)
