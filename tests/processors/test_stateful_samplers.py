"""Mirostat 1, adaptive-p and the thinking budget follow the stateful protocol: `is_stateful`, a
fresh state in every `generate` call with one instance (HF's included), `reset`, and a row that
continues another row's tokens (beams reordered without a call) takes that row's state."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList

from hfbridge.processors import AdaptivePLogitsWarper, MirostatV1LogitsWarper, ThinkingBudgetLogitsProcessor
from hfbridge.processors._stateful import is_stateful

from _tiny_models import model_cache

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

_model = model_cache()
PROMPT = torch.tensor([[5, 9, 13, 2, 7, 21], [0, 0, 3, 4, 11, 7]])
MASK = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])

MAKERS = {
    "mirostat 1": lambda: MirostatV1LogitsWarper(2.0, 0.5),
    "adaptive-p": lambda: AdaptivePLogitsWarper(0.2, 0.8),
    "thinking budget": lambda: ThinkingBudgetLogitsProcessor(2, [21], [30, 31]),
}


@pytest.mark.parametrize("name", list(MAKERS))
def test_one_instance_is_fresh_in_every_generate_call(name):
    processor = MAKERS[name]()
    assert is_stateful(processor)
    hf = _model("llama")
    outputs = []
    for _ in range(2):
        torch.manual_seed(3)
        outputs.append(hf.generate(PROMPT, attention_mask=MASK, use_cache=False, max_new_tokens=10, do_sample=True,
                                   top_k=0, logits_processor=LogitsProcessorList([processor])))
    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("name", list(MAKERS))
def test_rows_swapped_between_calls_keep_their_states(name):
    torch.manual_seed(0)
    steps = [torch.randn(2, 40) * 2 for _ in range(5)]
    ids = torch.tensor([[21, 3], [21, 4]])
    straight, swapped = MAKERS[name](), MAKERS[name]()
    for scores in steps:
        out = straight(ids, scores)
        # the same rows, in the other order: each output row must follow its own tokens
        out_swapped = swapped(ids.flip(0), scores.flip(0))
        assert torch.equal(out_swapped, out.flip(0))
        ids = torch.cat([ids, out.argmax(-1, keepdim=True)], 1)
        ids = ids.flip(0) if ids.shape[1] % 2 else ids  # the batch order changes, as beam search's does


@pytest.mark.parametrize("name", list(MAKERS))
def test_reset_forgets(name):
    processor = MAKERS[name]()
    torch.manual_seed(0)
    scores = torch.randn(1, 40)
    first = processor(torch.tensor([[21, 3]]), scores)
    processor(torch.tensor([[21, 3, 4]]), scores)
    processor.reset()
    assert torch.equal(processor(torch.tensor([[21, 3]]), scores), first)
