"""The last stage of a `Sampler` step, as functions of what they are given: the draw (HF's softmax and
multinomial, per-row groups and generator lists included; the argmax is `greedy_choice`), the fast path's draw
(whole, or group by group), and the checks of rows left with nothing to choose, whose error is exact mode's.
`Sampler.step` calls them on the route `route.py` decides; nothing here decides a route.

>>> import torch
>>> from hfbridge._step.run.per_row_draw import RowState
>>> choose(torch.tensor([[0.0, 2.0, float("-inf")]]), generator=None, rows=RowState(None, None), do_sample=True,
...        error=lambda bad, scores: ValueError(bad)).tolist()
[1]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from transformers import LogitsProcessorList

from hfbridge._step.checks.row_errors import invalid_rows_error
from hfbridge._step.fast.fast_path import fast_draw
from hfbridge._step.run.exact_draw import draw_one, softmax
from hfbridge._step.run.grouped_record import GroupedRecord
from hfbridge._step.run.per_row_draw import Generators, RowState, choose_rows, fast_rows
from hfbridge._step.run.processor_list import CheckedProcessorList, Recorder, processor_name
from hfbridge._step.run.sampler_rows import float_copy

__all__ = ["FastFlags", "bad_rows_error", "check_generator", "choose", "fast_step", "invalid_best", "one_generator"]

RowsError = Callable[[torch.Tensor, torch.Tensor], Exception]  # (bad (rows,) bool, scores) -> exact mode's error


def one_generator(generator: Generators) -> torch.Generator | None:
    """The generator of a whole-batch draw: None for a list (each row is drawn with its own)."""
    return generator if isinstance(generator, torch.Generator) else None


def check_generator(generator: Generators, device: torch.device) -> None:
    """`ValueError` unless the generator (or each of a list) is on the logits' `device`."""
    for index, one in enumerate(generator if isinstance(generator, (list, tuple)) else [generator]):
        if one is None:
            continue
        generator_device = torch.device(one.device)
        if generator_device.type != device.type or (
            device.type != "cpu" and (generator_device.index or 0) != (device.index or 0)
        ):
            name = "generator" if isinstance(generator, torch.Generator) else f"generator[{index}]"
            raise ValueError(
                f"`{name}` is on {generator_device} but the logits are on {device}; "
                f"create it with torch.Generator(device={str(device)!r})."
            )


def bad_rows_error(bad: torch.Tensor, raw: torch.Tensor, scores: torch.Tensor | None, *, processors: Sequence[Any],
                   do_sample: bool, row_numbers: tuple[int, torch.Tensor] | None = None) -> ValueError:
    """Exact mode's error for the rows `bad` left with nothing to choose: NaN or +inf (sampling), or over-eager
    processors. `row_numbers`: `(the batch's rows, (n,) these rows among them)` for a phase's rows of a larger
    batch (`phases.py`): the error names the batch's rows, the others spread in as valid zeros."""
    if row_numbers is not None:
        total, index = row_numbers
        bad, raw = _spread(bad, index, total), _spread(raw, index, total)
        scores = None if scores is None else _spread(scores, index, total)
    names = [processor_name(p) for p in processors]
    return invalid_rows_error(raw, scores, sampling=do_sample, processor_names=names, bad=bad)


def invalid_best(best: torch.Tensor, do_sample: bool) -> torch.Tensor | None:
    """One host read: the `(rows,)` bool rows whose best score leaves nothing to choose (-inf or NaN; +inf too
    when sampling; HF's argmax takes +inf), or None when every row is valid."""
    if do_sample:  # False for -inf (nothing left), +inf and NaN
        valid = best.abs() < float("inf")
        return None if bool(valid.all()) else ~valid
    worst = float(best if best.numel() == 1 else best.amin())  # amin propagates NaN: the minimum alone tells
    return None if worst > float("-inf") else ~(best > float("-inf"))


def choose(scores: torch.Tensor, *, generator: Generators, rows: RowState, do_sample: bool,
           error: RowsError) -> torch.Tensor:
    """HF's draw: `softmax` then `torch.multinomial(num_samples=1)`; per-row groups and generator lists draw each
    row as it would be drawn alone, a temperature of 0 greedy. `error(bad, scores)` is raised for rows with
    nothing left to choose (all -inf, NaN, or +inf)."""
    if (rows.plan is not None and rows.plan.mixed) or isinstance(generator, (list, tuple)):
        rows.check(scores.shape[0], generator)
        tokens, invalid = choose_rows(scores, rows.samples_on(scores.device), generator, rows.sample_rows())
        if invalid is not None:  # read by `choose_rows`, which drew nothing then
            raise error(invalid, scores)
        return tokens
    probs = softmax(scores)  # HF's softmax; on CPU into a reused buffer (no page faults on fresh memory)
    try:
        # torch.multinomial reads its input to refuse NaN / inf / all-zero rows (a host read we
        # cannot avoid); checking the rows before it would add a second one. On CPU `draw_one`
        # gives its tokens and leaves the generator as it does, with a logarithm per kept token only.
        return draw_one(probs, one_generator(generator), softmax_output=True)
    except RuntimeError as failure_:
        failure = failure_
    bad = invalid_best(scores.amax(dim=-1), do_sample)  # names the row
    if bad is not None:
        raise error(bad, scores)
    raise failure


def fast_step(input_ids: torch.Tensor, rows: torch.Tensor, processors: LogitsProcessorList, *,
              generator: Generators, row_state: RowState, head_length: int, memo: dict[str, Any],
              record: Recorder | None = None) -> Any:
    """The fused path's draw (a `FastDraw`, or a `GroupedDraw` per group or per row): no host read.

    Per-row groups or a generator list: the chain's places before its first warper (`head_length`: guidance,
    penalties, your processors) run once on the whole batch, exactly as exact mode runs them; then each group's
    own warpers, fused, on its rows alone (`per_row_draw.fast_rows`). `record(processor, scores)` is called
    after each processor of the chain with the whole batch's `(rows, vocab)` scores the draw reads.
    """
    # float32 rows are lent read-only: the fast path copies where it writes (a temperature's
    # division makes the copy), instead of a copy here and a division in place there
    lent = rows.dtype == torch.float32
    if row_state.plan is None and not isinstance(generator, (list, tuple)):  # one draw for the batch
        return fast_draw(input_ids, rows if lent else float_copy(rows), processors, one_generator(generator),
                         memo=memo, read_only=lent, record=record)
    ids = cast(torch.LongTensor, input_ids)
    if head_length:
        head = CheckedProcessorList(processors[:head_length])
        scores, lent = head.run(ids, float_copy(rows), record=record), False  # [N, V]
    else:
        scores = rows
    units = row_state.units(processors, generator, rows.shape[0], rows.device, head_length)
    if record is None:
        return fast_rows(input_ids, scores, units, read_only=lent)
    grouped = GroupedRecord(list(processors), head_length, scores if head_length else float_copy(rows),
                            row_state.copies)
    result = fast_rows(input_ids, scores, units, read_only=lent,
                       records=[grouped.unit(index, own) for index, _, own, _, _, _ in units])
    grouped.emit(record)
    return result


def _spread(part: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    """`part` `(n, ...)` at the rows `index` of a `(rows, ...)` tensor of zeros (False)."""
    whole = torch.zeros((rows, *part.shape[1:]), dtype=part.dtype, device=part.device)
    return whole.index_copy_(0, index.to(part.device), part)


class FastFlags:
    """The last fast step's rows that could not be sampled: a `(rows,)` bool on the device (or one CPU row's answer,
    known), and the draw with its raw rows for exact mode's error, kept until `take` reads them."""

    def __init__(self) -> None:
        self.valid: torch.Tensor | bool | None = None  # [N] bool, or one row's answer
        self.last: tuple[Any, torch.Tensor] | None = None  # (FastDraw or GroupedDraw, (rows, vocab) raw rows)

    def keep(self, result: Any, rows: torch.Tensor) -> None:
        """A fast step's draw: its validity kept without a host read."""
        known = result.known_valid  # the one-row CPU draw knows it on the host
        if known:  # valid, known without a read: nothing to keep for an error
            self.valid, self.last = True, None
        else:
            self.valid, self.last = (known if known is not None else result.valid), (result, rows)

    def invalid(self) -> torch.Tensor | None:
        """`(rows,)` bool, True for a row the last draw could not sample; None before a fast step."""
        if isinstance(self.valid, bool):  # one CPU row whose draw knew the answer: no tensor made until asked
            return torch.tensor([not self.valid])
        return None if self.valid is None else ~self.valid

    def take(self, invalid: bool | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """`(bad, raw, scores)` for exact mode's error when a row could not be sampled, else None; the draw let go.
        `invalid`: whether any row is, when the caller has read it (None: read here, one host read)."""
        last, self.last = self.last, None
        if last is None:
            return None
        result, raw = last
        if invalid is None:
            known = result.known_valid  # the one-row CPU draw's answer: no op to read
            invalid = not known if known is not None else bool((~result.valid).any())
        return (~result.valid, raw, result.final_scores()) if invalid else None  # invalid rows keep their cause
