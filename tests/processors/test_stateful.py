"""Mirostat's state per row: it follows beams (told with `reorder`, or found from `input_ids` as in
transformers' own beam search), goes back with `rollback`, forgets with `reset`.

The reference runs each sequence alone through a fresh processor, prefix by prefix.
"""

import torch

from hfbridge import Sampler
from hfbridge.processors import MirostatLogitsWarper
from hfbridge.processors._stateful import is_stateful

V = 30


def scores_for(ids, seed):
    """A fixed score row for each prefix (what a model would give), in log-probabilities as HF's beams use."""
    rows = []
    for row in ids.tolist():
        g = torch.Generator().manual_seed(seed * 1000 + sum((i + 1) * t for i, t in enumerate(row)))
        rows.append(torch.log_softmax(torch.randn(V, generator=g) * 3, -1))
    return torch.stack(rows)


def alone(sequence, prompt_length, **options):
    """The mu a fresh processor reaches on `sequence` alone, called on each prefix from the prompt on."""
    warper = MirostatLogitsWarper(**options)
    for length in range(prompt_length, sequence.shape[0] + 1):
        prefix = sequence[None, :length]
        warper(prefix, scores_for(prefix, length))
    return warper.mu


def beam_steps(tell):
    """Three calls where the rows move as HF's beam search moves them; `tell` calls `reorder` too."""
    options = dict(tau=1.5, eta=0.8)
    warper = MirostatLogitsWarper(**options)
    ids = torch.tensor([[3, 4], [5, 6], [7, 8]])
    for beam_idx in (None, torch.tensor([1, 1, 0]), torch.tensor([2, 0, 0])):
        if beam_idx is not None:
            kept = warper(ids, scores_for(ids, ids.shape[1]))  # the call on the rows before the move
            chosen = kept.argmax(-1)  # a kept token: mu moves
            if tell:
                warper.reorder(beam_idx)
            ids = torch.cat([ids[beam_idx], chosen[beam_idx, None]], dim=1)
    warper(ids, scores_for(ids, ids.shape[1]))
    return ids, warper.mu, options


def test_mirostat_follows_beams_it_is_not_told_about():
    ids, mu, options = beam_steps(tell=False)
    expected = torch.cat([alone(row, 2, **options) for row in ids])
    assert torch.allclose(mu, expected, rtol=0, atol=1e-6)
    assert len(set(mu.tolist())) > 1  # the rows continue different beams


def test_mirostat_follows_reorder():
    ids, mu, options = beam_steps(tell=True)
    expected = torch.cat([alone(row, 2, **options) for row in ids])
    assert torch.allclose(mu, expected, rtol=0, atol=1e-6)


def _three_calls():
    warper = MirostatLogitsWarper(tau=1.5, eta=0.8)
    ids = torch.tensor([[3, 4], [5, 6]])
    for _ in range(3):  # calls on 2, 3 and 4 tokens
        kept = warper(ids, scores_for(ids, ids.shape[1]))
        ids = torch.cat([ids, kept.argmax(-1, keepdim=True)], dim=1)
    return warper, ids  # 5 tokens


def test_rollback_returns_to_the_state_of_that_length():
    warper, ids = _three_calls()
    warper.rollback(torch.tensor([3, 3]))  # the drafted tokens after the third are rejected
    kept = ids[:, :3]
    warper(kept, scores_for(kept, 3))
    expected = torch.cat([alone(row, 2, tau=1.5, eta=0.8) for row in kept])
    assert torch.allclose(warper.mu, expected, rtol=0, atol=1e-6)


def test_rollback_to_one_past_the_last_call_continues():
    warper, ids = _three_calls()
    warper.rollback(torch.tensor([5, 5]))  # every drafted token accepted
    warper(ids, scores_for(ids, 5))
    expected = torch.cat([alone(row, 2, tau=1.5, eta=0.8) for row in ids])
    assert torch.allclose(warper.mu, expected, rtol=0, atol=1e-6)


def test_reset_forgets():
    warper = MirostatLogitsWarper(tau=1.0)
    ids = torch.tensor([[1, 2]])
    warper(ids, scores_for(ids, 0))
    warper.reset()
    assert warper.mu is None
    warper(torch.tensor([[1, 2, 3]]), scores_for(ids, 1))
    assert warper.mu.tolist() == [2.0]  # 2 tau: a fresh row


def test_sampler_forwards_the_protocol_to_each_groups_own_processor():
    sampler = Sampler(mirostat=2, mirostat_tau=[1.0, 2.0, 1.0], mirostat_eta=0.5, do_sample=True)
    assert sampler.is_stateful and is_stateful(MirostatLogitsWarper())
    ids = torch.tensor([[1, 2], [3, 4], [5, 6]])
    sampler(torch.randn(3, V, generator=torch.Generator().manual_seed(0)), ids)
    parts = [part for part, _ in sampler.processors[-1].parts]
    before = [part.mu.clone() for part in parts]
    sampler.reorder(torch.tensor([2, 1, 0]))  # rows 0 and 2 share a group (tau 1.0): they swap in it
    assert torch.equal(parts[0].mu, before[0].flip(0)) and torch.equal(parts[1].mu, before[1])
    sampler.reset()
    assert all(part.mu is None for part in parts)


class _Recording(MirostatLogitsWarper):
    """Mirostat that keeps each call's rows, scores and resulting mu."""

    def __init__(self, **options):
        super().__init__(**options)
        self.calls = []

    def __call__(self, input_ids, scores):
        out = super().__call__(input_ids, scores)
        self.calls.append((input_ids.clone(), scores.clone(), self.mu.clone()))
        return out


def test_mirostat_follows_beams_in_transformers_own_generate():
    from _tiny_models import tiny_gpt2

    model = tiny_gpt2()
    warper = _Recording(tau=2.0, eta=0.8)
    prompt = torch.tensor([[5, 9, 13]])
    torch.manual_seed(0)
    model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, num_beams=3, max_new_tokens=5,
                   logits_processor=[warper], pad_token_id=0, top_k=0)
    seen = {tuple(row.tolist()): scores[i] for ids, scores, _ in warper.calls for i, row in enumerate(ids)}
    moved = 0
    for ids, _, mu in warper.calls[1:]:
        for row, sequence in enumerate(ids):
            reference = MirostatLogitsWarper(tau=2.0, eta=0.8)
            for length in range(prompt.shape[1], sequence.shape[0] + 1):
                reference(sequence[None, :length], seen[tuple(sequence[:length].tolist())][None])
            assert torch.allclose(mu[row:row + 1], reference.mu, rtol=0, atol=1e-5), (ids.shape, row)
            moved += int(reference.mu.item() != 4.0)
    assert moved  # the states did move
