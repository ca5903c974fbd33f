"""`CheckedProcessorList.run` calls transformers' and hfbridge's own processor classes directly, as HF's list
would, without HF's `inspect.signature` per processor per call; anything else goes through HF's list."""

from __future__ import annotations

import inspect

import torch
from transformers import LogitsProcessorList, TopKLogitsWarper

from hfbridge._step.run.processor_list import CheckedProcessorList, _takes_scores_only
from hfbridge.processors import DRYLogitsProcessor, TopNSigmaLogitsWarper, XTCLogitsWarper


class MyXTC(XTCLogitsWarper):
    """A user's subclass, in the user's module: it may take more arguments, so HF's list decides."""


def _chain():
    return [TopKLogitsWarper(5), TopNSigmaLogitsWarper(1.0), DRYLogitsProcessor(0.8, sequence_breakers=[[3]]),
            XTCLogitsWarper(threshold=0.1, probability=1.0, generator=torch.Generator().manual_seed(0))]


def test_own_classes_are_called_directly_and_others_through_hf(monkeypatch):
    asked = []
    signature = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda function, *a, **k: asked.append(function) or signature(
        function, *a, **k))
    ids, scores = torch.tensor([[1, 2, 3, 1, 2]]), torch.randn(1, 16, generator=torch.Generator().manual_seed(1))
    for processor in _chain():
        _takes_scores_only(processor)  # each class learnt once, before the calls counted below
    asked.clear()
    ours = CheckedProcessorList(_chain()).run(ids, scores.clone())
    assert asked == []  # no signature read during the call
    expected = LogitsProcessorList(_chain())(ids, scores.clone())  # HF's own list, from the same generator state
    assert torch.equal(ours, expected)

    user = MyXTC(threshold=0.1, probability=1.0, generator=torch.Generator().manual_seed(0))
    CheckedProcessorList([user]).run(ids, scores.clone())
    assert len(asked) >= 1 and not _takes_scores_only(user)


def test_an_instance_with_its_own_call_goes_through_hf():
    processor = XTCLogitsWarper(threshold=0.1, probability=1.0)
    processor.__call__ = lambda input_ids, scores: scores  # type: ignore[method-assign]
    assert _takes_scores_only(XTCLogitsWarper(threshold=0.1, probability=1.0))
    assert not _takes_scores_only(processor)
