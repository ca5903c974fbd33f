"""HFBridgeLM against lm-eval's own HFLM on the same tiny model: scores, rolling windows, generated text."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("lm_eval.api", reason="lm-eval is not installed (pip install -e '.[lm-eval]')")
pytest.importorskip("accelerate")  # lm-eval's HFLM, the reference, imports it

import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from transformers import GPT2LMHeadModel

from hfbridge import Recompute, ReturnsCache
from hfbridge.lm_eval import HFBridgeLM

from _lm_eval_fixtures import CONTEXT, CORPUS
from _tiny_models import positions

pytestmark = pytest.mark.usefixtures("one_thread")


CACHE = "cache" if "cache" in inspect.signature(GPT2LMHeadModel.forward).parameters else "past_key_values"


def requests(kind, args):
    return [Instance(kind, {}, arg, index) for index, arg in enumerate(args)]


def masked_callable(hf):
    """`model(input_ids, attention_mask) -> logits` `[B, T, V]`, positions from the mask as HF's generate makes them."""
    def model(input_ids, attention_mask):
        return hf(input_ids, attention_mask=attention_mask, position_ids=positions(attention_mask)).logits
    return model


def forms(hf):
    """The HF model passed directly, as plain callables, and in two adapters."""
    def returns_cache(input_ids, cache, attention_mask):
        position_ids = positions(attention_mask)[:, -input_ids.shape[1]:]
        out = hf(input_ids, **{CACHE: cache}, attention_mask=attention_mask, position_ids=position_ids,
                 use_cache=True)
        return out.logits, out[CACHE]
    return {"hf_model": hf, "callable": lambda ids: hf(ids).logits, "masked_callable": masked_callable(hf),
            "recompute": Recompute(masked_callable(hf)), "returns_cache": ReturnsCache(returns_cache)}


def greedy_continuation(hf, tokenizer, context, n):
    """A continuation text whose tokens are the model's greedy choices after `context` (from HF's generate)."""
    ids = torch.tensor([tokenizer.encode(context)])
    out = hf.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)
    return tokenizer.decode(out[0, ids.shape[1]:])


@pytest.fixture
def loglikelihood_requests(hf_model, tokenizer):
    greedy = greedy_continuation(hf_model, tokenizer, "Paris is the capital of", 3)
    return requests("loglikelihood", [
        ("The sky is", " blue"), ("The sky is", " green"),  # one-token continuations of one context
        ("Paris is the capital of", greedy), ("Paris is the capital of", greedy[:3]),  # greedy ones
        ("The capital of France is ", "Paris"),  # the trailing space moves to the continuation
        ("", "Hello world"),  # an empty context: the prefix token
        ("One two", " three four five six seven eight nine ten"),
        (CORPUS[4] * 3, " shells"),  # longer than max_length: truncated from the left
        ("A", "B"), ("A", "b"),
    ])


@pytest.mark.parametrize("form", ["hf_model", "callable", "masked_callable", "recompute", "returns_cache"])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_loglikelihood_matches_hflm(hf_model, tokenizer, folder, loglikelihood_requests, form, batch_size):
    from transformers import AutoTokenizer
    reference = HFLM(pretrained=hf_model, tokenizer=AutoTokenizer.from_pretrained(folder),
                     batch_size=batch_size).loglikelihood(loglikelihood_requests)
    ours = HFBridgeLM(forms(hf_model)[form], tokenizer, batch_size=batch_size,
                      max_length=CONTEXT).loglikelihood(loglikelihood_requests)
    assert any(greedy for _, greedy in reference) and not all(greedy for _, greedy in reference)
    assert [greedy for _, greedy in ours] == [greedy for _, greedy in reference]
    assert [score for score, _ in ours] == pytest.approx([score for score, _ in reference], abs=1e-4)


@pytest.mark.parametrize("max_length", [None, 16, 7])
@pytest.mark.parametrize("form", ["hf_model", "callable"])
def test_loglikelihood_rolling_matches_hflm(hf_model, tokenizer, folder, max_length, form):
    from transformers import AutoTokenizer
    texts = [" ".join(CORPUS), CORPUS[0], "x", " ".join(reversed(CORPUS))]
    assert len(tokenizer.encode(texts[0])) > 2 * CONTEXT
    batch = requests("loglikelihood_rolling", [(text,) for text in texts])
    reference = HFLM(pretrained=hf_model, tokenizer=AutoTokenizer.from_pretrained(folder), batch_size=3,
                     max_length=max_length).loglikelihood_rolling(batch)
    ours = HFBridgeLM(forms(hf_model)[form], tokenizer, batch_size=3,
                      max_length=max_length or CONTEXT).loglikelihood_rolling(batch)
    assert ours == pytest.approx(reference, abs=1e-3)


def generation_requests(stops):
    prompts = ["The sky", "Paris is the capital", "Numbers: one", "She sells sea shells by the", "A"]
    return requests("generate_until", [(prompt, {"until": stops, "max_gen_toks": 12, "do_sample": False})
                                       for prompt in prompts])


@pytest.mark.parametrize("form", ["hf_model", "masked_callable", "callable", "returns_cache"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_generate_until_greedy_matches_hflm(hf_model, tokenizer, folder, form, batch_size):
    from transformers import AutoTokenizer

    def hflm():
        return HFLM(pretrained=hf_model, tokenizer=AutoTokenizer.from_pretrained(folder), batch_size=batch_size)

    free = hflm().generate_until(generation_requests([]))
    # stop strings taken from HF's own text, so that some rows stop early (one in the middle of a token)
    stops = sorted({text[len(text) // 2:len(text) // 2 + 2] for text in free if len(text) > 4})[:2]
    reference = hflm().generate_until(generation_requests(stops))
    assert reference != free
    lm = HFBridgeLM(forms(hf_model)[form], tokenizer, batch_size=batch_size)
    assert lm.generate_until(generation_requests([])) == free
    assert lm.generate_until(generation_requests(stops)) == reference


def test_generate_until_sampling_matches_hflm_for_the_same_seed(hf_model, tokenizer, folder):
    from transformers import AutoTokenizer
    batch = requests("generate_until", [(prompt, {"until": ["\n"], "max_gen_toks": 8, "do_sample": True,
                                                  "temperature": 0.9, "top_k": 20})
                                        for prompt in ["The sky", "Paris is", "One"]])
    torch.manual_seed(7)
    reference = HFLM(pretrained=hf_model, tokenizer=AutoTokenizer.from_pretrained(folder),
                     batch_size=3).generate_until(batch)
    torch.manual_seed(7)
    assert HFBridgeLM(hf_model, tokenizer, batch_size=3).generate_until(batch) == reference
