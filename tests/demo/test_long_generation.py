"""The demo model's KV cache slides when full: generations through it can be of any length."""

from __future__ import annotations

import re

import pytest
import torch

from hfbridge import ReturnsCache, generate
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
        with pytest.raises(ValueError, match="exceed block_size=16"):
            model(torch.zeros(1, 17, dtype=torch.long), cache=model.new_cache())  # a prompt must fit


def test_shipped_model_generates_2000_tokens_through_its_cache():
    model, tok = load_demo_model(), load_demo_tokenizer()
    ids = tok("The lighthouse keeper", return_tensors="pt").input_ids
    out = generate(ReturnsCache(model.forward_cached), ids, max_new_tokens=2000, do_sample=True, temperature=0.8,
                   top_p=0.95, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, ids.shape[1] + 2000)
    words = re.findall(r"[A-Za-z]+", tok.decode(out[0, -1000:], skip_special_tokens=True))
    corpus_words = set(re.findall(r"[A-Za-z]+", " ".join(corpus_documents())))
    assert len(words) > 150 and sum(w in corpus_words for w in words) / len(words) > 0.9  # still words at the end
