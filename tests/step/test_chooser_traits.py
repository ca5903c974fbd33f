"""The samplers that choose the final token themselves say so on the class (`picks_token`; mirostat's
`replaces_chain`: `hfbridge/processors/_traits.py`), and the chain reads the traits, not a list of class names: at
most one such sampler, and none that replaces llama.cpp's chain with `sampler_order`. Errors name each one's
switch."""

import pytest
import torch
from transformers import LogitsProcessor

from hfbridge import sample_step
from hfbridge._step.plan.option_table import OptionRow, register, unregister
from hfbridge.processors import AdaptivePLogitsWarper, MirostatLogitsWarper, MirostatV1LogitsWarper
from hfbridge.processors._traits import own_trait

X, IDS = torch.zeros(1, 8), torch.tensor([[1]])


def test_the_classes_declare_it():
    assert [own_trait(kind, "picks_token") for kind in (MirostatLogitsWarper, MirostatV1LogitsWarper,
                                                        AdaptivePLogitsWarper)] == [True, True, True]
    assert [own_trait(kind, "replaces_chain") for kind in (MirostatLogitsWarper, MirostatV1LogitsWarper,
                                                           AdaptivePLogitsWarper)] == [True, True, None]


@pytest.mark.parametrize("mirostat", [1, 2])
def test_two_that_pick_the_token(mirostat):
    with pytest.raises(ValueError) as error:
        sample_step(X, IDS, mirostat=mirostat, adaptive_target=0.5, top_k=0)
    assert str(error.value) == ("`mirostat` and `adaptive_target` both choose the final token from a distribution "
                                "of their own (llama.cpp runs one or the other): pass one of them.")


@pytest.mark.parametrize("mirostat", [1, 2])
def test_an_order_with_mirostat(mirostat):
    with pytest.raises(ValueError) as error:
        sample_step(X, IDS, mirostat=mirostat, sampler_order="top_k;temperature", top_k=0)
    assert str(error.value) == ("`sampler_order` orders llama.cpp's sampler chain, which `mirostat` replaces "
                                "(llama.cpp ignores the order then): pass one of them.")


class ArgmaxLogitsWarper(LogitsProcessor):
    """Keeps only each row's best token: it chooses the token itself (an example written for this test)."""

    picks_token = True

    def __init__(self, margin=0.0):
        self.margin = margin  # a token within `margin` of the best is kept too

    def __call__(self, input_ids, scores):
        return scores.masked_fill(scores < scores.amax(-1, keepdim=True) - self.margin, float("-inf"))


@pytest.fixture
def argmax_row():
    register(OptionRow("argmax_margin", ArgmaxLogitsWarper, argument="margin", default=None, switch=True,
                       sampling=True, per_row=False, bounds={"minimum": 0.0}, place="last"))
    yield
    unregister("argmax_margin")


def test_a_new_sampler_that_picks_the_token(argmax_row):
    assert sample_step(torch.tensor([[0.0, 3.0, 1.0]]), argmax_margin=0.5, top_k=0).tolist() == [1]
    with pytest.raises(ValueError) as error:
        sample_step(X, IDS, argmax_margin=0.5, adaptive_target=0.5, top_k=0)
    assert str(error.value).startswith("`adaptive_target` and `argmax_margin` both choose the final token")
