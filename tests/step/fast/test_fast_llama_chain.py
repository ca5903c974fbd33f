"""The llama.cpp-style chain through the fast path: HF's kept set, the caller's logits untouched, each row alone."""

import pytest
import torch

from hfbridge import Sampler
from hfbridge._step.fast.fast_path import fast_draw

NEG_INF = float("-inf")
CHAIN = dict(do_sample=True, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5, penalty_last_n=64,
             dry_multiplier=0.8, dry_sequence_breakers=[], top_k=40, top_p=0.95, min_p=0.05, temperature=0.8)


def inputs(rows, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 3
    ids = torch.randint(0, vocab, (rows, 50), generator=g)
    ids[:, 25:] = ids[:, :25]  # a repeat for DRY
    return logits, ids


@pytest.mark.parametrize("rows,vocab", [(1, 32000), (3, 5000), (1, 300)])
@pytest.mark.parametrize("options", [CHAIN, dict(CHAIN, presence_penalty=0.0, frequency_penalty=0.0,
                                                  repetition_penalty=1.0),
                                     dict(CHAIN, sampler_order="penalties;dry;top_k;top_p;min_p;temperature")],
                         ids=["penalties", "penalties off", "llama.cpp's order"])
def test_final_scores_are_hfs_and_the_logits_stay(rows, vocab, options):
    logits, ids = inputs(rows, vocab)
    before = logits.clone(), ids.clone()
    exact = Sampler(**options)
    expected = exact.process(ids, logits.clone())  # HF's chain, HF's order
    fast = Sampler(fast=True, generator=torch.Generator().manual_seed(0), **options)
    result = fast_draw(ids, logits, fast.processors, torch.Generator().manual_seed(0), read_only=True)
    assert torch.equal(logits, before[0]) and torch.equal(ids, before[1])  # borrowed, never written
    assert torch.equal(result.final_scores(), expected)
    for _ in range(50):
        tokens = fast(logits, ids)
        assert bool((expected.gather(1, tokens[:, None]) > NEG_INF).all())
    assert torch.equal(logits, before[0]) and torch.equal(ids, before[1])


def test_each_row_draws_as_it_would_alone():
    logits, ids = inputs(3, 5000, seed=1)
    together = Sampler(fast=True, generator=[torch.Generator().manual_seed(row) for row in range(3)], **CHAIN)
    alone = [Sampler(fast=True, generator=torch.Generator().manual_seed(row), **CHAIN) for row in range(3)]
    for _ in range(20):
        tokens = together(logits, ids)
        assert tokens.tolist() == [int(alone[row](logits[row:row + 1], ids[row:row + 1])) for row in range(3)]


def test_borrowed_scores_reach_only_the_penalties_class_itself():
    from transformers import LogitsProcessorList, TopKLogitsWarper

    from hfbridge.processors import PresenceFrequencyPenaltyLogitsProcessor

    class InPlace(PresenceFrequencyPenaltyLogitsProcessor):  # a subclass may write: it gets a private copy
        def __call__(self, input_ids, scores):
            return scores.add_(1.0)

    logits, ids = inputs(2, 3000, seed=2)
    before = logits.clone()
    for penalties in (PresenceFrequencyPenaltyLogitsProcessor(0.0, 0.0, 64),  # off: hands back what it got
                      PresenceFrequencyPenaltyLogitsProcessor(0.5, 0.5, 64), InPlace(0.5, 0.5, 64)):
        processors = LogitsProcessorList([penalties, TopKLogitsWarper(5)])
        expected = processors(ids, logits.clone())
        out = fast_draw(ids, logits, processors, torch.Generator().manual_seed(0), read_only=True)
        assert torch.equal(logits, before)
        assert torch.equal(out.final_scores(), expected)
        assert torch.equal(logits, before)
