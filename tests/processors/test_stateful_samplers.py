"""Mirostat 1, adaptive-p and the thinking budget follow the stateful protocol: `is_stateful`, a
fresh state in every `generate` call with one instance (HF's included), `reset`, and a row that
continues another row's tokens (beams reordered without a call) takes that row's state."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList

from hfbridge.processors import (
    AdaptivePLogitsWarper,
    MirostatLogitsWarper,
    MirostatV1LogitsWarper,
    ThinkingBudgetLogitsProcessor,
)
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


# per-row values: rows 0-1 one prompt's (two beams), rows 2-3 another's, which starts with the same tokens
PER_ROW = {
    "mirostat 2": lambda values: MirostatLogitsWarper(tau=values, eta=0.5),
    "mirostat 1": lambda values: MirostatV1LogitsWarper(tau=values, eta=0.5),
    "adaptive-p": lambda values: AdaptivePLogitsWarper(target=[v / 10 for v in values], decay=0.8),
    "thinking budget": lambda values: ThinkingBudgetLogitsProcessor([int(v) for v in values], [5], [30]),
}


def _state(processor):
    return {"mu": getattr(processor, "mu", None), "state": getattr(processor, "state", None),
            "phase": getattr(processor, "phase", None)}


@pytest.mark.parametrize("name", list(PER_ROW))
def test_identical_prompts_with_other_values_keep_their_own_states(name):
    # transformers' beam search moves rows within each prompt's block without telling the processor: a row
    # whose tokens two prompts share takes the state of a row with its own per-row values, not the first one
    scores = torch.randn(4, 40, generator=torch.Generator().manual_seed(0)) * 0.3  # near uniform: tokens kept
    both, alone = PER_ROW[name]([1.0, 1.0, 3.0, 3.0]), PER_ROW[name]([3.0, 3.0])
    calls = [[[5, 9]] * 4, [[5, 9, 1], [5, 9, 2], [5, 9, 2], [5, 9, 1]],
             [[5, 9, 1, 3], [5, 9, 2, 3], [5, 9, 1, 3], [5, 9, 2, 3]], [[5, 9, 1, 3, 4]] * 4]
    for ids in calls:
        out = both(torch.tensor(ids), scores.clone())
        assert torch.equal(out[2:], alone(torch.tensor(ids[2:]), scores[2:].clone()))
    for key, value in _state(both).items():
        if value is not None:
            assert torch.equal(value[2:], _state(alone)[key]), key
    assert any(value is not None and not torch.equal(value[:2], value[2:]) for value in _state(both).values())


@pytest.mark.parametrize("name", ["mirostat 2", "mirostat 1", "adaptive-p"])
def test_identical_prompts_with_other_values_in_transformers_beam_search(name):
    hf = _model("llama")
    prompt = torch.tensor([[3, 8, 21, 4, 3]])
    options = dict(num_beams=2, num_return_sequences=2, max_new_tokens=8, do_sample=False, pad_token_id=0)
    both = hf.generate(prompt.repeat(2, 1), attention_mask=torch.ones(2, 5, dtype=torch.long),
                       logits_processor=LogitsProcessorList([PER_ROW[name]([0.5, 0.5, 4.0, 4.0])]), **options)
    for rows, value in ((slice(0, 2), 0.5), (slice(2, 4), 4.0)):  # each prompt as if it were alone
        alone = hf.generate(prompt, attention_mask=torch.ones(1, 5, dtype=torch.long),
                            logits_processor=LogitsProcessorList([PER_ROW[name]([value, value])]), **options)
        assert torch.equal(both[rows], alone), f"\nboth:\n{both}\nalone ({value}):\n{alone}"
