"""A padded batch for a model whose forward takes no `attention_mask`: refused (passed) or warned (inferred)."""

import warnings

import pytest
import torch

from hfbridge import ReturnsCache, generate

from _tiny_models import TinyCore, TinyMasked, TinyRecompute

pytestmark = pytest.mark.usefixtures("one_thread")

ROW = torch.tensor([[5, 9, 13, 7]])
PADDED = torch.tensor([[0, 0, 5, 9, 13, 7], [3, 4, 5, 6, 7, 8]])  # row 0 is ROW, left-padded
MASK = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
REFUSED = (r"^`attention_mask` has padding \(zeros\) in row\(s\) \[0\], but the model takes no `attention_mask` "
           r"parameter \(its parameters: {params}\), so it would attend to the padding and those rows' tokens would "
           r"change\. Give the model's forward an `attention_mask` parameter \(a `\*\*kwargs` does not count; .*\), "
           r"or generate each prompt on its own, without padding\.$")


def core() -> TinyCore:
    torch.manual_seed(0)
    return TinyCore()


def test_padding_changes_a_maskless_models_tokens():
    """Why it is refused: the row alone and the same row padded differ for a model that sees the padding."""
    model = TinyRecompute(core())
    alone = generate(model, ROW, max_new_tokens=8)
    padded = generate(model, PADDED, max_new_tokens=8, attention_mask=torch.ones_like(MASK))  # what it would do
    assert not torch.equal(alone[0, 4:], padded[0, 6:])
    with pytest.raises(ValueError, match=REFUSED.format(params="idx")):
        generate(model, PADDED, attention_mask=MASK, max_new_tokens=8)


def test_a_model_taking_the_mask_runs():
    model = TinyMasked(core())
    alone = generate(model, ROW, max_new_tokens=8)
    padded = generate(model, PADDED, attention_mask=MASK, max_new_tokens=8)
    assert torch.equal(alone[0, 4:], padded[0, 6:])


def test_returns_cache_and_kwargs_are_refused_too():
    def step(input_ids, cache):
        return torch.zeros(input_ids.shape[0], input_ids.shape[1], 16), cache

    with pytest.raises(ValueError, match=REFUSED.format(params="input_ids, cache")):
        generate(ReturnsCache(step), PADDED, attention_mask=MASK, max_new_tokens=2)

    def catch_all(input_ids, **kwargs):  # receives no mask: a `**kwargs` is not a mask parameter
        return torch.zeros(input_ids.shape[0], input_ids.shape[1], 16)

    with pytest.raises(ValueError, match=REFUSED.format(params=r"input_ids, \*\*kwargs")):
        generate(catch_all, PADDED, attention_mask=MASK, max_new_tokens=2)


def test_an_inferred_mask_warns():
    model = TinyRecompute(core())
    with pytest.warns(UserWarning, match=r"^`pad_token_id` appears in the prompt of row\(s\) \[0\], so the attention "
                                         r"mask inferred from it \(HF's rule\) has padding, .* pass attention_mask= "
                                         r"of ones\.$"):
        generate(model, PADDED, max_new_tokens=2, pad_token_id=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generate(model, PADDED, attention_mask=torch.ones_like(MASK), max_new_tokens=2, pad_token_id=0)
        generate(model, PADDED[1:], max_new_tokens=2, pad_token_id=0)  # no pad id in the prompt
