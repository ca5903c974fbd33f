"""`sampler_order`: the chain equals the same processors listed by hand in that order (scores, and
tokens in transformers' own `generate`); llama.cpp's `test_sampler_queue` (tests/test-sampling.cpp)
for every order of top-k, top-p and min-p; other processors keep their places; the fast path;
errors for orders that cannot be honoured."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hfbridge import Recompute, Sampler, build_processors, generate, sample_step
from hfbridge._step.fast.fast_path import fast_scores
from hfbridge.processors import DRYLogitsProcessor, XTCLogitsWarper

from _tiny_models import model_cache, recompute_callable

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

_model = model_cache()


def names(processors):
    return [type(p).__name__ for p in processors]


def test_the_named_samplers_in_the_order_given():
    built = build_processors(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.2,
                             dry_multiplier=0.8, dry_sequence_breakers=[], no_repeat_ngram_size=2,
                             sampler_order="temperature;min_p;top_p;top_k;dry;penalties")
    # HF's chain: penalty, DRY, no-repeat-n-gram, temperature, top-k, top-p, min-p; the named ones refill
    # their places in the order given, no-repeat-n-gram keeps its own
    assert names(built) == ["TemperatureLogitsWarper", "MinPLogitsWarper", "NoRepeatNGramLogitsProcessor",
                            "TopPLogitsWarper", "TopKLogitsWarper", "DRYLogitsProcessor",
                            "RepetitionPenaltyLogitsProcessor"]
    # HF's order without it; llama.cpp's default order is HF's for these
    assert names(build_processors(temperature=0.7, top_k=20, top_p=0.9)) == names(build_processors(
        temperature=0.7, top_k=20, top_p=0.9, sampler_order="temperature;top_k;top_p")) == [
        "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"]


@pytest.mark.parametrize("order", ["top_p;top_k;temperature", "temperature;top_p;min_p;top_k",
                                   ["min-p", "top-k", "temp", "nucleus"]])
def test_scores_equal_the_processors_listed_by_hand(order):
    torch.manual_seed(0)
    scores = torch.randn(3, 50) * 3
    ids = torch.randint(0, 50, (3, 4))
    listed = order.split(";") if isinstance(order, str) else order
    min_p = {"min_p": 0.05} if {"min_p", "min-p"} & set(listed) else {}
    built = build_processors(temperature=0.6, top_k=12, top_p=0.8, sampler_order=order, **min_p)
    by_name = {"top_k": TopKLogitsWarper(12), "top_p": TopPLogitsWarper(0.8), "min_p": MinPLogitsWarper(0.05),
               "temperature": TemperatureLogitsWarper(0.6), "top-k": TopKLogitsWarper(12),
               "nucleus": TopPLogitsWarper(0.8), "min-p": MinPLogitsWarper(0.05), "temp": TemperatureLogitsWarper(0.6)}
    by_hand = LogitsProcessorList([by_name[name] for name in listed])
    assert torch.equal(built(ids, scores.clone()), by_hand(ids, scores.clone()))
    assert torch.equal(fast_scores(ids, scores.clone(), built), by_hand(ids, scores.clone()))


@pytest.mark.parametrize("model_name", ["gpt2", "llama"])
def test_generate_equals_hf_generate_with_the_processors_by_hand(model_name):
    hf = _model(model_name)
    prompt = torch.tensor([[5, 9, 13, 2, 7, 21], [0, 0, 3, 4, 11, 7]])
    mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])
    by_hand = LogitsProcessorList([TopPLogitsWarper(0.7), XTCLogitsWarper(0.05, 1.0), DRYLogitsProcessor(0.8, 1.75, 2, -1, []),
                                   RepetitionPenaltyLogitsProcessor(1.3), TemperatureLogitsWarper(0.5)])
    torch.manual_seed(2)
    theirs = hf.generate(prompt, attention_mask=mask, use_cache=False, max_new_tokens=10, do_sample=True, top_k=0,
                         logits_processor=by_hand)
    torch.manual_seed(2)
    ours = generate(Recompute(recompute_callable(hf)), prompt, attention_mask=mask, max_new_tokens=10, top_k=0,
                    top_p=0.7, xtc_threshold=0.05, xtc_probability=1.0, dry_multiplier=0.8, dry_sequence_breakers=[],
                    repetition_penalty=1.3, temperature=0.5, sampler_order="top_p;xtc;dry;penalties;temperature")
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"


def _queue_expected(n_vocab, sequence, top_k, top_p, min_p):
    """llama.cpp's test_sampler_queue: (size, smallest token id) after the samplers in `sequence`."""
    min_token_id, size = 0, n_vocab
    for s in sequence:
        if s == "k":
            size = min(size, top_k)
            min_token_id = max(min_token_id, n_vocab - top_k)
        elif s == "p":
            divisor = n_vocab * (n_vocab - 1) // 2 - min_token_id * (min_token_id - 1) // 2
            target = math.ceil(top_p * divisor)
            min_token_id, size, total = n_vocab, 0, 0
            while True:
                min_token_id -= 1
                size += 1
                total += min_token_id
                if total >= target:
                    break
        else:
            expected = max(math.ceil((1.0 - min_p) * n_vocab), 1)
            size = min(expected, size)
            min_token_id = min(max(math.floor(min_p * n_vocab), 1, n_vocab - size), n_vocab - 1)
    return size, min_token_id


ORDERS = ["kp", "km", "pk", "pm", "mk", "mp", *("".join(p) for p in itertools.permutations("kpm"))]


@pytest.mark.parametrize("sequence", ORDERS)
def test_llama_cpp_sampler_queue(sequence):
    n_vocab, top_k, top_p, min_p = 10000, 100, 0.8, 0.1
    scores = torch.arange(n_vocab, dtype=torch.float32).log()[None]  # llama.cpp: logit = log(id)
    names_ = {"k": "top_k", "p": "top_p", "m": "min_p"}
    options = {"top_k": top_k if "k" in sequence else 0, "top_p": top_p if "p" in sequence else 1.0}
    if "m" in sequence:
        options["min_p"] = min_p
    built = build_processors(do_sample=True, sampler_order=[names_[s] for s in sequence], **options)
    kept = built(None, scores.clone())[0].isfinite().nonzero().flatten()
    assert (len(kept), int(kept.min())) == _queue_expected(n_vocab, sequence, top_k, top_p, min_p)


def test_other_processors_keep_their_places():
    options = dict(temperature=0.5, top_k=4, min_length=5, eos_token_id=2, prompt_length=1, no_repeat_ngram_size=3)
    hf_order = names(build_processors(**options))
    assert hf_order[-2:] == ["TemperatureLogitsWarper", "TopKLogitsWarper"]
    assert names(build_processors(**options, sampler_order="top_k;temperature")) == [
        *hf_order[:-2], "TopKLogitsWarper", "TemperatureLogitsWarper"]


def test_sampler_and_sample_step_take_it():
    torch.manual_seed(0)
    logits = torch.randn(2, 30)
    ids = torch.tensor([[1], [2]])
    generator = torch.Generator().manual_seed(1)
    sampler = Sampler(temperature=3.0, top_k=3, sampler_order="top_k;temperature", generator=generator)
    assert names(sampler.processors) == ["TopKLogitsWarper", "TemperatureLogitsWarper"]
    token = sample_step(logits, ids, temperature=3.0, top_k=3, sampler_order="top_k;temperature",
                        generator=torch.Generator().manual_seed(1))
    assert torch.equal(token, sampler(logits, ids))


def test_with_per_row_values():
    torch.manual_seed(0)
    scores = torch.randn(2, 40) * 2
    ids = torch.tensor([[1], [2]])
    sampler = Sampler(temperature=[0.5, 2.0], top_p=[0.5, 0.9], top_k=5, sampler_order="top_p;top_k;temperature")
    got = sampler.process(ids, scores.clone())
    for row, (t, p) in enumerate([(0.5, 0.5), (2.0, 0.9)]):
        by_hand = LogitsProcessorList([TopPLogitsWarper(p), TopKLogitsWarper(5), TemperatureLogitsWarper(t)])
        assert torch.equal(got[row], by_hand(ids[row:row + 1], scores[row:row + 1].clone())[0])


@pytest.mark.parametrize("options,error,message", [
    (dict(sampler_order="top_k;topp"), ValueError,
     r"^`sampler_order\[1\]` is 'topp', not one of llama.cpp's sampler names; did you mean 'top_p'\?"),
    (dict(sampler_order="top_k;top_k"), ValueError, r"^`sampler_order` names 'top_k' twice \(at 0 and 1\)"),
    (dict(sampler_order="top-k;top_k"), ValueError, r"^`sampler_order` names 'top_k' twice"),
    (dict(sampler_order="infill;top_k"), ValueError, r"names 'infill'.*does not provide"),
    (dict(sampler_order=""), ValueError, r"^`sampler_order` is empty"),
    (dict(sampler_order=[]), ValueError, r"^`sampler_order` is empty"),
    (dict(sampler_order=3), TypeError, r"^`sampler_order` must be a string of names separated by ';'"),
    (dict(sampler_order=["top_k", 3]), TypeError, r"^`sampler_order\[1\]` must be a sampler's name"),
    (dict(sampler_order="adaptive_p;top_k"), ValueError, r"puts 'adaptive_p' before other samplers"),
    (dict(sampler_order="top_p;temperature", temperature=0.5), ValueError,
     r"^`sampler_order` leaves out 'top_k', which the options turn on \(TopKLogitsWarper, from `top_k`; "
     r"transformers samples with top_k=50 unless told otherwise: top_k=0 turns it off\)"),
    (dict(sampler_order="top_k;temperature", top_k=5, repetition_penalty=1.2), ValueError,
     r"^`sampler_order` leaves out 'penalties'"),
    (dict(sampler_order="top_k;temperature", mirostat=2), ValueError,
     r"^`sampler_order` orders llama.cpp's sampler chain, which `mirostat` replaces"),
])
def test_orders_that_cannot_be_honoured(options, error, message):
    with pytest.raises(error, match=message):
        sample_step(torch.zeros(1, 8), torch.tensor([[1]]), do_sample=True, **options)


def test_greedy_orders_the_penalties_too():
    built = build_processors(repetition_penalty=1.5, dry_multiplier=1.0, dry_sequence_breakers=[],
                             sampler_order="dry;penalties")
    assert names(built) == ["DRYLogitsProcessor", "RepetitionPenaltyLogitsProcessor"]
    assert isinstance(built[1], RepetitionPenaltyLogitsProcessor) and isinstance(built[0], DRYLogitsProcessor)
    assert NoRepeatNGramLogitsProcessor  # imported for the chain above
