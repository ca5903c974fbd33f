"""The replay's loop: `generate`'s one-token step run again over recorded tokens (`replay.py` calls it).

Each step does what `loop.decode` does, in the same order and on the same tensors: the step's logits
`(rows, vocab)` (from the model through the same adapter and cache, or given), a float32 copy, the
call's `Sampler.process` on the sequences so far, or, where the chain draws random numbers (XTC's
coins) or a generator is given, the step itself (`Sampler.step`: the processors, then the draw) with
that generator, so the random stream advances as the generation's did; then the *recorded* token is
appended (the drawn one is only compared with it), and HF's stopping criteria mark the finished rows.
Stateful processors (mirostat, adaptive-p, a thinking budget) see the same sequences in the same
order, so their state follows the generation's.

>>> import torch
>>> from hfbridge import generate, replay
>>> table = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
>>> out = generate(lambda ids: table[ids], torch.tensor([[1]]), max_new_tokens=3, do_sample=True, top_k=3,
...                generator=torch.Generator().manual_seed(1), return_dict_in_generate=True, output_scores=True)
>>> again = replay(lambda ids: table[ids], out.sequences, prompt_length=1, do_sample=True, top_k=3,
...                max_new_tokens=3, generator=torch.Generator().manual_seed(1))
>>> all(torch.equal(a, b) for a, b in zip(again.scores, out.scores))
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import torch

from hfbridge._generate.finished import FinishedRows
from hfbridge._generate.loop import _rows as last_position_rows
from hfbridge._generate.loop import at_step, forward_and_update
from hfbridge._generate.prepared import Call
from hfbridge._hf.stand_in import special_token
from hfbridge._models.adapters import ModelAdapter

__all__ = ["ReplayedSteps", "StepLogits", "given_logits", "model_logits", "replay_steps"]

# step -> the step's logits `(rows, vocab)`, read only
StepLogits = Callable[[Call, int], torch.Tensor]


@dataclasses.dataclass
class ReplayedSteps:
    """What the loop computed, per step: the processed scores and the raw logits' figures of the token."""

    scores: tuple[torch.Tensor, ...]  # per step [N, V] float32, as generate's output_scores
    raw_logprobs: torch.Tensor  # [N, S] log_softmax of the raw logits at the token
    raw_kept_mass: torch.Tensor  # [N, S] raw probability of the tokens the scores keep (> -inf)
    generated: torch.Tensor  # [N, S] bool: the row was unfinished when the token was chosen (not filler)
    mismatch: torch.Tensor | None  # [N, S] bool: a drawn token differs from the recorded one (None: not drawn)


def model_logits(adapter: ModelAdapter) -> StepLogits:
    """The step's logits from the model, called through `adapter` and its cache as `loop.decode` calls it."""
    def step_logits(call: Call, step: int) -> torch.Tensor:
        call.state["attention_mask"] = call.mask
        outputs, call.state = forward_and_update(adapter, call.sequences, call.state, step,
                                                 f"{call.sequences.shape[1]} tokens so far, {step} replayed")
        view = last_position_rows(call.sampler, adapter.logits(outputs), step, call.sequences.shape[0],
                                  call.prompts, call.expand)  # [N, V]
        return view if view.device == call.sequences.device else view.to(call.sequences.device)
    return step_logits


def given_logits(per_step: tuple[torch.Tensor, ...] | torch.Tensor) -> StepLogits:
    """The step's logits from `per_step` (a tuple of `(rows, vocab)`, or `(rows, steps, vocab)`), vocabulary trimmed
    as the `Sampler` trims a model's (`vocab_size=`, a tokenizer's size)."""
    def step_logits(call: Call, step: int) -> torch.Tensor:
        rows = per_step[step] if isinstance(per_step, tuple) else per_step[:, step]  # [N, V']
        limit = call.sampler.vocab_limit(rows.shape[-1])
        if limit is not None:
            if rows.shape[-1] < limit:
                raise ValueError(f"replay(): `logits` at step {step} have {rows.shape[-1]} vocabulary columns, fewer "
                                 f"than vocab_size={limit}.")
            rows = rows[:, :limit]
        return rows if rows.device == call.sequences.device else rows.to(call.sequences.device)
    return step_logits


def replay_steps(call: Call, tokens: torch.Tensor, logits: StepLogits, *, draw: bool) -> ReplayedSteps:
    """Run the call's step over `tokens` `(rows, steps)` (the recorded new tokens), in place on `call`.

    `draw`: choose a token at each step as the generation did (advancing the generator as it did) and
    compare it with the recorded one on the unfinished rows.
    """
    sampler = call.sampler
    rows, steps = tokens.shape
    device = call.sequences.device
    # the flags stay on the device: read once, at the end (`_check_stops`), not at every step
    finished = FinishedRows(rows, device, call.criteria, check_every=steps + 1)
    pad = special_token(call.config, "pad") if call.pads_finished else None
    route = sampler.route(keep_scores=True, keep_raw=True)  # exact: the scores are the replay's result
    scores_per_step: list[torch.Tensor] = []
    raw_logprobs, kept_mass, generated, mismatch, not_padded, invalid = [], [], [], [], [], []
    vocab = None
    for step in range(steps):
        view = logits(call, step)  # [N, V], read only
        if vocab is None:
            vocab = view.shape[1]
            at_step(step, lambda: sampler.input_rows(call.sequences, view))  # prompt ids within the vocabulary
            _check_tokens(tokens, vocab)
        elif view.shape[1] != vocab:
            raise ValueError(f"replay(): at step {step} the logits have {view.shape[1]} vocabulary columns, but "
                             f"{vocab} at step 0.")
        work = view.to(torch.float32, copy=True)  # [N, V], the step's scores (the processors may write into it)
        drawn = None
        if draw:  # the step itself, processors then choice: the generator advances as the generation's did
            result = at_step(step, lambda: sampler.step(call.sequences, view, scores=work, route=route, defer=False))
            scores, drawn = cast(torch.Tensor, result.scores), result.tokens  # [N, V] (kept on this route), [N]
        else:
            scores = at_step(step, lambda: sampler.process(call.sequences, work))  # [N, V]
        scores_per_step.append(scores)
        best = scores.amax(dim=-1)  # [N]: NaN, nothing kept, or +inf when sampling: generate raises
        invalid.append(~(best.abs() < float("inf")) if sampler.do_sample else ~(best > float("-inf")))
        token = tokens[:, step]  # [N]
        raw = torch.log_softmax(view.to(torch.float32), dim=-1)  # [N, V]
        raw_logprobs.append(raw.gather(1, token[:, None])[:, 0])
        kept_mass.append(torch.where(scores > float("-inf"), raw, float("-inf")).logsumexp(-1).exp())
        live = finished.unfinished  # [N]
        generated.append(live)
        if drawn is not None:
            mismatch.append(live & (drawn != token))
        if pad is not None:
            not_padded.append(~live & (token != pad))  # read once, at the end
        call.sequences = torch.cat([call.sequences, token[:, None]], dim=-1)  # [N, T + 1]
        call.mask = torch.cat([call.mask, call.mask.new_ones((rows, 1))], dim=-1)
        finished.after_step(call.sequences, None, step=step)
    if invalid:
        _check_valid(torch.stack(invalid, dim=1))
    if steps:
        _check_stops(torch.stack(generated, dim=1), call.sequences.shape[1] - steps, finished.max_length)
    if not_padded:
        _check_padding(torch.stack(not_padded, dim=1), tokens, pad)
    return ReplayedSteps(
        scores=tuple(scores_per_step),
        raw_logprobs=_stacked(raw_logprobs, rows, device, torch.float32),
        raw_kept_mass=_stacked(kept_mass, rows, device, torch.float32),
        generated=_stacked(generated, rows, device, torch.bool),
        mismatch=_stacked(mismatch, rows, device, torch.bool) if draw else None,
    )


def _stacked(values: list[torch.Tensor], rows: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.stack(values, dim=1) if values else torch.zeros((rows, 0), dtype=dtype, device=device)


def _check_tokens(tokens: torch.Tensor, vocab: int) -> None:
    outside = (tokens < 0) | (tokens >= vocab)  # [N, S]
    if bool(outside.any()):
        row, column = (int(i) for i in outside.nonzero()[0])
        raise ValueError(f"replay(): `sequences` row {row} holds token id {int(tokens[row, column])} at new position "
                         f"{column}, outside the {vocab} vocabulary columns of the logits.")


def _check_padding(not_padded: torch.Tensor, tokens: torch.Tensor, pad: Any) -> None:
    """Every token chosen after its row finished is the pad token, as generate writes it (`not_padded`: [N, S])."""
    if bool(not_padded.any()):
        row, step = (int(i) for i in not_padded.nonzero()[0])
        raise ValueError(
            f"replay(): row {row} had finished before step {step} (a stopping criterion: eos_token_id, stop_strings), "
            f"so generate gave it the pad token {pad}, but `sequences` hold {int(tokens[row, step])} there; pass the "
            "options the generation used (eos_token_id, pad_token_id).")


def _check_valid(invalid: torch.Tensor) -> None:
    """No step left a row with nothing to draw (`invalid`: [N, S]); generate would have raised there."""
    if bool(invalid.any()):
        row, step = (int(i) for i in invalid.nonzero()[0])
        raise ValueError(
            f"replay(): at step {step}, row {row} has nothing to draw: its scores after the processors are NaN, "
            "-inf everywhere or +inf (NaN logits?), where generate raises; no distribution can be replayed there.")


def _check_stops(generated: torch.Tensor, start: int, max_length: int | None) -> None:
    """The recorded steps end where generate stops: no step after every row had finished (`generated`: [N, S])."""
    steps = generated.shape[1]
    last = steps - 1 if max_length is None else min(steps, max_length - start) - 1  # the last step the length allows
    done = (~generated.any(dim=0)).nonzero()  # steps at which every row had finished before
    if done.numel():
        last = min(last, int(done[0, 0]) - 1)
    if last < steps - 1:
        raise ValueError(
            f"replay(): every row had finished after step {last} (the stopping criteria: eos_token_id, "
            f"max_new_tokens, stop_strings), where generate stops, but `sequences` have {steps} new tokens; pass the "
            "options the generation used, or the sequences it returned.")
