"""The demo model's KV cache slides when full: generations through it can be of any length."""

from __future__ import annotations

import re

import pytest
import torch

from hfbridge import BannedStrings, ReturnsCache, generate
from hfbridge.demo import DemoConfig, DemoLM, load_demo_model, load_demo_tokenizer
from hfbridge.demo.train import corpus_documents

pytestmark = pytest.mark.usefixtures("one_thread")


def small() -> DemoLM:
    torch.manual_seed(0)
    return DemoLM(DemoConfig(vocab_size=40, block_size=16, n_layer=2, n_embd=16, n_head=2)).eval()


@torch.no_grad()
def test_each_step_equals_the_full_forward_of_its_window():
    """By hand: after a slide the cache holds the last half block, computed from position 0, so every
    step's logits are the plain forward pass of the tokens from `cache.start` on."""
    model = small()
    ids = torch.randint(0, 40, (2, 60), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache()
    model(ids[:, :5], cache=cache)
    starts = set()
    for t in range(5, 60):
        stepped = model(ids[:, t:t + 1], cache=cache)[:, -1]  # [2, V]
        window = ids[:, cache.start:t + 1]
        assert window.shape[1] <= 16 and cache.length == window.shape[1]
        torch.testing.assert_close(stepped, model(window)[:, -1], atol=1e-5, rtol=1e-5)
        starts.add(cache.start)
    # the 17th position slides: 17 seen, the newest 8 kept, 9 dropped; then 8 + 9 = 17 again, every 9 tokens
    assert sorted(starts) == [0, 9, 18, 27, 36, 45]


@torch.no_grad()
def test_a_padded_batch_slides_with_the_whole_sequences_mask():
    model = small()
    ids = torch.randint(2, 40, (2, 6), generator=torch.Generator().manual_seed(2))
    ids[0, :2] = 0
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    out = generate(ReturnsCache(model.forward_cached), ids, attention_mask=mask, max_new_tokens=40)
    # By hand, row 1 (no padding): every new token is the argmax of the forward pass of its window.
    seq, cache = out[1:], model.new_cache()
    model(seq[:, :6], cache=cache)
    for t in range(6, 45):
        model(seq[:, t:t + 1], cache=cache)
        assert int(model(seq[:, cache.start:t + 1])[0, -1].argmax()) == int(seq[0, t + 1])


def test_mask_and_block_errors():
    model = small()
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.zeros(1, 16, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match=r"^attention_mask: expected 17 columns \(cached \+ new positions\) or "
                                             r"17 \(the whole sequence\), got \(1, 5\)$"):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache, attention_mask=torch.ones(1, 5))
        with pytest.raises(ValueError, match=r"^idx: 0 cached \+ 17 new positions exceed block_size=16; a prompt "
                                             r"\(or one call's new tokens\) must fit in 16 positions$"):
            model(torch.zeros(1, 17, dtype=torch.long), cache=model.new_cache())  # a prompt must fit
    # without a cache (generate(model, ...) recomputes the whole sequence): the error names the cached call
    with pytest.raises(ValueError, match=r"^idx: 17 positions exceed block_size=16, the positions the model learned; "
                                         r"for a longer generation call it through its KV cache, which slides: "
                                         r"generate\(ReturnsCache\(model.forward_cached\), \.\.\.\) \(ReturnsCache "
                                         r"is hfbridge's\)\nhfbridge.generate: raised at step 13 "):
        generate(model, torch.zeros(1, 4, dtype=torch.long), max_new_tokens=14)


@torch.no_grad()
def test_crop_before_and_after_a_slide_keeps_each_step_the_forward_of_its_window():
    """Crops to random lengths, before the last slide too (the dropped half computed again from position 0):
    each step's logits stay the plain forward pass of the tokens from `cache.start` on, as without crops."""
    model = small()
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 40, (2, 200), generator=gen)
    cache = model.new_cache()
    model(ids[:, :5], cache=cache)
    t, steps, crops_before_start = 5, 0, 0
    while t < 200 and steps < 150:
        steps += 1
        if t > 8 and torch.rand((), generator=gen) < 0.25:  # take back 1 to 12 positions
            back = int(torch.randint(1, 13, (), generator=gen))
            crops_before_start += t - back <= cache.start
            assert cache.crop(t - back) is cache
            t -= back
        new = int(torch.randint(1, 4, (), generator=gen))  # one to three tokens per call, as drafts
        stepped = model(ids[:, t:t + new], cache=cache)  # [2, new, V]
        t += new
        assert cache.ids is not None and cache.start + cache.ids.shape[1] == t == cache.start + cache.length
        assert torch.equal(torch.cat([cache.dropped, cache.ids], 1) if cache.start else cache.ids, ids[:, :t])
        torch.testing.assert_close(stepped, model(ids[:, cache.start:t])[:, -new:], atol=1e-5, rtol=1e-5)
    assert crops_before_start >= 3


@torch.no_grad()
def test_shipped_model_rolls_back_banned_strings_past_the_slide():
    model, tok = load_demo_model(), load_demo_tokenizer()
    ids = tok("The lighthouse keeper", return_tensors="pt").input_ids
    bans = BannedStrings(tok, ["the baker", " the "], regex=[r"\bmap\b"])
    out = generate(ReturnsCache(model.forward_cached), ids, max_new_tokens=600, banned_strings=bans, do_sample=True,
                   temperature=0.8, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, ids.shape[1] + 600)
    text = tok.decode(out[0, ids.shape[1]:])
    assert " the " not in text.lower() and "the baker" not in text.lower()
    assert max(rewind.position for rewind in bans.rewinds) > 256  # a rollback in a cache that slid


@torch.no_grad()
def test_shipped_model_prompt_lookup_through_its_cache():
    """Assisted decoding crops the drafts the model rejects: greedy tokens as without drafts (no slide yet),
    and on past the slide."""
    model, tok = load_demo_model(), load_demo_tokenizer()
    ids = tok("The lighthouse keeper", return_tensors="pt").input_ids
    plain = generate(ReturnsCache(model.forward_cached), ids, max_new_tokens=200)
    drafted = generate(ReturnsCache(model.forward_cached), ids, max_new_tokens=400, prompt_lookup_num_tokens=5)
    assert drafted.shape == (1, ids.shape[1] + 400)
    assert torch.equal(drafted[:, :plain.shape[1]], plain)


def test_shipped_model_generates_2000_tokens_through_its_cache():
    model, tok = load_demo_model(), load_demo_tokenizer()
    ids = tok("The lighthouse keeper", return_tensors="pt").input_ids
    out = generate(ReturnsCache(model.forward_cached), ids, max_new_tokens=2000, do_sample=True, temperature=0.8,
                   top_p=0.95, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, ids.shape[1] + 2000)
    words = re.findall(r"[A-Za-z]+", tok.decode(out[0, -1000:], skip_special_tokens=True))
    corpus_words = set(re.findall(r"[A-Za-z]+", " ".join(corpus_documents())))
    assert len(words) > 150 and sum(w in corpus_words for w in words) / len(words) > 0.9  # still words at the end
