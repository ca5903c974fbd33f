"""Assisted decoding, prompt-lookup decoding and `prefix_allowed_tokens_fn`, against HF's own.

Tiny random `GPT2LMHeadModel` / `LlamaForCausalLM` (tests/_tiny_models.py) are called through the
recompute form and the KV-cache forms, and compared with `model.generate` on the same options and
the same `torch.manual_seed`.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor

from hfbridge import Recompute, ReturnsCache, Sampler, build_processors, generate, sample_step

from _tiny_models import HF_MODELS, recompute_callable, returns_cache_callable

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

_MODELS: dict = {}


def _model(name):
    if name not in _MODELS:
        _MODELS[name] = HF_MODELS[name]()
    return _MODELS[name]


@pytest.fixture
def no_python_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ------------------------------------------------------------------------------------------
# prefix_allowed_tokens_fn
# ------------------------------------------------------------------------------------------


def _even_after_odd(batch_id, input_ids):
    """Row 0: after an odd token only even ones; row 1: only tokens 20..29. Depends on the row and its tokens."""
    if batch_id == 1:
        return list(range(20, 30))
    return list(range(0, 48, 2)) if int(input_ids[-1]) % 2 else list(range(48))


PADDED = (torch.tensor([[5, 9, 13, 2, 7, 21], [0, 0, 0, 3, 4, 11]]), torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]]))
FORMS = {  # name -> (adapter factory, HF's use_cache)
    "recompute": (lambda hf: Recompute(recompute_callable(hf)), False),
    "returns_cache": (lambda hf: ReturnsCache(returns_cache_callable(hf)), True),
}


@pytest.mark.parametrize("model_name", list(HF_MODELS))
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("options", [dict(do_sample=False), dict(do_sample=True, top_k=10, temperature=1.3)],
                         ids=["greedy", "sample"])
def test_prefix_allowed_tokens_fn_matches_hf(model_name, form, options):
    hf = _model(model_name)
    make_adapter, use_cache = FORMS[form]
    prompt, mask = PADDED
    torch.manual_seed(7)
    theirs = hf.generate(prompt, attention_mask=mask, use_cache=use_cache, max_new_tokens=8,
                         prefix_allowed_tokens_fn=_even_after_odd, **options)
    torch.manual_seed(7)
    ours = generate(make_adapter(hf), prompt, attention_mask=mask, max_new_tokens=8,
                    prefix_allowed_tokens_fn=_even_after_odd, **options)
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"
    new = ours[:, prompt.shape[1]:]
    assert bool(((new[1] >= 20) & (new[1] < 30)).all())  # the constraint really acted
    previous = ours[0, prompt.shape[1] - 1:-1]
    assert bool((new[0][previous % 2 == 1] % 2 == 0).all())


def test_prefix_allowed_tokens_fn_in_the_step_api():
    """Sampler, sample_step and build_processors build HF's processor where HF puts it, and apply it."""
    processors = build_processors(prefix_allowed_tokens_fn=_even_after_odd, repetition_penalty=1.2)
    assert [type(p).__name__ for p in processors] == ["RepetitionPenaltyLogitsProcessor",
                                                      "PrefixConstrainedLogitsProcessor"]
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 48)
    ids = torch.tensor([[4, 7, 9], [1, 2, 3]])
    expected = PrefixConstrainedLogitsProcessor(_even_after_odd, 1)(ids, logits[:, -1].clone()).argmax(-1)
    assert sample_step(logits, ids, prefix_allowed_tokens_fn=_even_after_odd).tolist() == expected.tolist()
    sampler = Sampler(prefix_allowed_tokens_fn=_even_after_odd)
    assert sampler(logits, ids).tolist() == expected.tolist()
    assert expected[0] % 2 == 0 and 20 <= expected[1] < 30


def test_prefix_allowed_tokens_fn_errors():
    model = Recompute(lambda ids: torch.zeros(ids.shape[0], ids.shape[1], 8))
    calls = []
    with pytest.raises(TypeError, match=r"`prefix_allowed_tokens_fn` must be callable as "
                                        r"prefix_allowed_tokens_fn\(batch_id, input_ids\).*got list"):
        generate(lambda ids: calls.append(1), torch.tensor([[1, 2]]), prefix_allowed_tokens_fn=[1, 2])
    assert calls == []  # refused before the first model call
    with pytest.raises(TypeError, match="must be callable"):
        sample_step(torch.zeros(1, 8), prefix_allowed_tokens_fn="abc")
    with pytest.raises(ValueError, match="returned an empty list for batch ID 0") as error:
        generate(model, torch.tensor([[1, 2]]), max_new_tokens=2, prefix_allowed_tokens_fn=lambda b, ids: [])
    assert "raised by the logits processors at step 0" in "".join(getattr(error.value, "__notes__", []))


def test_prefix_allowed_tokens_fn_merges_with_processors():
    """A user processor list and the constraint together, as HF's `_get_logits_processor` merges them."""
    def boost(input_ids, scores):
        return scores + torch.arange(scores.shape[-1], dtype=scores.dtype)

    processors = build_processors(processors=LogitsProcessorList([boost]), prefix_allowed_tokens_fn=_even_after_odd)
    assert [getattr(p, "__name__", type(p).__name__) for p in processors] == [
        "PrefixConstrainedLogitsProcessor", "boost"]
