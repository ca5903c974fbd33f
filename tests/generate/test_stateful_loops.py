"""Stateful processors in `generate`'s loops: reset at the start, reordered with the beams, rolled back
with rejected drafts, so that their state is always that of the row's own sequence.

`RunningSum` keeps, per row, the tokens it has seen (one per call: the last of `input_ids`) and boosts
the token `sum % vocab`; `StatelessSum` computes the same from `input_ids` alone. HF's own `generate`
with the stateless one is the reference: the stateful one gives the same tokens only if every loop
tells it what happened to its rows (and it raises if a call does not continue what it saw).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from transformers import LogitsProcessorList

from hfbridge import Recompute, ReturnsCache, generate
from hfbridge.processors import (
    AdaptivePLogitsWarper,
    MirostatLogitsWarper,
    MirostatV1LogitsWarper,
    ThinkingBudgetLogitsProcessor,
)

from _tiny_models import model_cache, positions, recompute_callable

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf")

_model = model_cache()
PROMPT = torch.tensor([[5, 7, 9, 11, 5, 7, 9, 30]])
LOOKUP_PROMPT = torch.tensor([[3, 8, 21, 4, 3, 8, 21, 4, 3, 8]])


class RunningSum:
    """Stateful: per row, `(length of input_ids, its last token)` for every call; boosts `sum % vocab`."""

    def __init__(self, boost: float = 4.0):
        self.boost = boost
        self.seen: list[list[tuple[int, int]]] | None = None
        self.calls = {"reset": 0, "reorder": 0, "rollback": 0}

    def __call__(self, input_ids, scores):
        length = input_ids.shape[1]
        if self.seen is None:
            self.seen = [[] for _ in range(input_ids.shape[0])]
        assert len(self.seen) == input_ids.shape[0]
        for row, seen in enumerate(self.seen):
            if seen and seen[-1][0] != length - 1:
                raise AssertionError(f"row {row}: a call at length {length} after one at {seen[-1][0]}")
            seen.append((length, int(input_ids[row, -1])))
        sums = torch.tensor([sum(token for _, token in seen) for seen in self.seen])
        out = scores.clone()
        out[torch.arange(out.shape[0]), sums % out.shape[1]] += self.boost
        return out

    def reset(self):
        self.calls["reset"] += 1
        self.seen = None

    def reorder(self, beam_idx):
        self.calls["reorder"] += 1
        if self.seen is not None:
            self.seen = [list(self.seen[int(i)]) for i in beam_idx]

    def rollback(self, lengths):
        self.calls["rollback"] += 1
        if self.seen is not None:
            self.seen = [[(n, t) for n, t in seen if n < int(keep)] for seen, keep in zip(self.seen, lengths)]


class StatelessSum:
    """The same boost from `input_ids` alone: the tokens from the prompt's last one on."""

    def __init__(self, prompt_length: int, boost: float = 4.0):
        self.start, self.boost = prompt_length - 1, boost

    def __call__(self, input_ids, scores):
        sums = input_ids[:, self.start:].sum(-1)
        out = scores.clone()
        out[torch.arange(out.shape[0]), sums % out.shape[1]] += self.boost
        return out


def _hf(hf, prompt, *, assistant=None, draft=None, seed=0, **options):
    saved = None if assistant is None else copy.deepcopy(assistant.generation_config)
    if assistant is not None:
        assistant.generation_config.update(**(draft or {}))
    try:
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return hf.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=assistant,
                               logits_processor=LogitsProcessorList([StatelessSum(prompt.shape[1])]), **options)
    finally:
        if assistant is not None:
            assistant.generation_config = saved


def all_logits_cached(hf):
    def model(input_ids, cache, attention_mask):
        position_ids = positions(attention_mask)[:, -input_ids.shape[1]:]
        out = hf(input_ids, past_key_values=cache, attention_mask=attention_mask, position_ids=position_ids,
                 use_cache=True)
        return out.logits, out.past_key_values

    return ReturnsCache(model)


def all_logits_recompute(hf):
    def model(input_ids, attention_mask):
        return hf(input_ids, attention_mask=attention_mask, position_ids=positions(attention_mask),
                  use_cache=False).logits

    return Recompute(model)


def test_generate_resets_a_stateful_processor_at_the_start():
    hf = _model("gpt2")
    processor = RunningSum()
    runs = [generate(Recompute(recompute_callable(hf)), PROMPT, max_new_tokens=8, processors=[processor])
            for _ in range(2)]  # the second call would fail its check without a reset
    assert processor.calls["reset"] == 2
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0], _hf(hf, PROMPT, max_new_tokens=8))


@pytest.mark.parametrize("sample", [False, True])
def test_beam_search_reorders_a_stateful_processor_with_the_beams(sample):
    hf = _model("gpt2")
    prompts = torch.tensor([[5, 7, 9, 11], [3, 8, 21, 4]])
    options = dict(num_beams=3, max_new_tokens=7, do_sample=sample, num_return_sequences=2)
    processor = RunningSum(boost=2.0)
    torch.manual_seed(4)
    ours = generate(Recompute(recompute_callable(hf)), prompts, processors=[processor], **options)
    processor_hf = StatelessSum(prompts.shape[1], boost=2.0)
    torch.manual_seed(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = hf.generate(prompts, attention_mask=torch.ones_like(prompts),
                             logits_processor=LogitsProcessorList([processor_hf]), **options)
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"
    assert processor.calls["reorder"] >= 6


DRAFT = dict(num_assistant_tokens=4, assistant_confidence_threshold=0.0)


@pytest.mark.parametrize("sample", [False, True])
def test_assisted_decoding_rolls_a_stateful_processor_back(sample):
    target, assistant = _model("gpt2"), _model("llama")  # the llama draft is often rejected
    options = dict(max_new_tokens=14, do_sample=sample)
    processor = RunningSum()
    torch.manual_seed(9)
    ours = generate(all_logits_cached(target), PROMPT, assistant_model=all_logits_recompute(assistant),
                    processors=[processor], **options, **DRAFT)
    theirs = _hf(target, PROMPT, assistant=assistant, draft=DRAFT, seed=9, **options)
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"
    assert processor.calls["rollback"] > 0
    if not sample:  # greedy: the plain run's tokens, and the state of a run that never saw a draft
        plain_processor = RunningSum()
        plain = generate(all_logits_cached(target), PROMPT, processors=[plain_processor], **options)
        assert torch.equal(ours, plain)
        assert processor.seen == [seen[:len(processor.seen[0])] for seen in plain_processor.seen]


def test_prompt_lookup_rolls_a_stateful_processor_back():
    hf = _model("gpt2")
    # an eos id: transformers 4.46's prompt lookup fails without one (`isin(ids, None)`)
    options = dict(max_new_tokens=12, prompt_lookup_num_tokens=3, eos_token_id=0)
    processor = RunningSum()
    ours = generate(all_logits_cached(hf), LOOKUP_PROMPT, processors=[processor], **options)
    assert torch.equal(ours, _hf(hf, LOOKUP_PROMPT, **options))
    plain_processor = RunningSum()
    plain = generate(all_logits_cached(hf), LOOKUP_PROMPT, processors=[plain_processor], max_new_tokens=12,
                     eos_token_id=0)
    assert torch.equal(ours, plain)


class Logged:
    """A stateful processor's calls, each with its state after it (the protocol's calls passed on)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __call__(self, input_ids, scores):
        out = self.inner(input_ids, scores)
        # HF's prompt lookup screens candidates with the processors on constant logits: not a step
        if not bool((scores == scores[:, :1]).all()):
            self.calls.append((input_ids.clone(), _state(self.inner)))
        return out

    def reset(self):
        self.inner.reset()

    def reorder(self, beam_idx):
        self.inner.reorder(beam_idx)

    def rollback(self, lengths):
        self.inner.rollback(lengths)


def _state(processor):
    for name in ("mu", "state", "phase"):
        if getattr(processor, name, None) is not None:
            return getattr(processor, name).clone()
    raise AssertionError(type(processor).__name__)


STATEFUL = {
    "mirostat 2": lambda: MirostatLogitsWarper(3.0, 0.3),
    "mirostat 1": lambda: MirostatV1LogitsWarper(3.0, 0.3),
    "adaptive-p": lambda: AdaptivePLogitsWarper(0.3, 0.9),
    "thinking budget": lambda: ThinkingBudgetLogitsProcessor(3, [2], [30]),
}
TABLE = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) * 2
DRAFTERS = {
    "prompt_lookup": dict(prompt_lookup_num_tokens=3),
    "assistant": dict(assistant_model=lambda ids: (TABLE + TABLE.flip(0))[ids], num_assistant_tokens=4,
                      assistant_confidence_threshold=0.0),
}


@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("name", list(STATEFUL))
def test_rejected_drafts_leave_no_state_behind(name, drafter):
    # after a rejected draft token the last accepted token is the target's own: the state at every step must be
    # the one a fresh processor reaches on the accepted tokens, one call per position
    logged = Logged(STATEFUL[name]())
    prompt = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 5]])
    torch.manual_seed(1)
    out = generate(lambda ids: TABLE[ids], prompt, max_new_tokens=20, do_sample=True, top_k=0, processors=[logged],
                   **DRAFTERS[drafter])
    fresh, expected = STATEFUL[name](), {}
    for length in range(prompt.shape[1], out.shape[1]):  # no call after the last token
        fresh(out[:, :length], TABLE[out[:, length - 1]])
        expected[length] = _state(fresh)
    steps = [(ids.shape[1], state) for ids, state in logged.calls if torch.equal(ids, out[:, :ids.shape[1]])]
    assert {length for length, _ in steps} == set(expected)
    for length, state in steps:
        torch.testing.assert_close(state, expected[length], rtol=0, atol=1e-5, msg=f"at length {length}")
    assert len(logged.calls) > len(steps)  # some draft tokens were rejected


def test_the_replayed_step_leaves_the_random_draws_alone():
    # XTC draws a coin at every call of the chain, the replayed one too: the run's RNG must not see it. A mirostat
    # whose cut keeps every token changes no score, so the tokens are those of the run without it (no replay)
    prompt = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 4, 5]])
    options = dict(max_new_tokens=16, do_sample=True, top_k=0, xtc_threshold=0.05, xtc_probability=0.5,
                   prompt_lookup_num_tokens=3)
    runs = []
    for processors in ([], [Logged(MirostatLogitsWarper(100.0, 0.1))]):
        torch.manual_seed(2)
        runs.append(generate(lambda ids: TABLE[ids], prompt, processors=processors, **options))
    assert torch.equal(runs[0], runs[1])
    assert len(processors[0].calls) > runs[1].shape[1] - prompt.shape[1]  # drafts were rejected, steps replayed
