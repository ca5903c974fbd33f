"""Choosing tokens when rows differ: greedy rows beside sampled ones, one generator per row, per-row fast draws.

- `choose_rows` (exact mode): HF's draw, `softmax` then `torch.multinomial`, for the sampled rows
  and HF's argmax for the greedy ones (a temperature of 0). With one generator per row, row i is
  drawn by `torch.multinomial` on its own `(1, vocab)` probabilities with generator i: exactly the
  draw of that row alone (the softmax of a row does not depend on the other rows).
- `fast_rows` (`fast=True`): the fast path once per group of rows with equal values (each group's
  own HF list, so the fused kernels see HF's classes with scalar values), or once per row with a
  generator per row; greedy groups take HF's argmax. A row drawn alone runs the same code on the
  same `(1, vocab)` row, so its token does not depend on the rest of the batch.

>>> import torch
>>> scores = torch.tensor([[0.0, 5.0], [3.0, float("-inf")]])  # row 1 can only draw token 0
>>> choose_rows(scores, torch.tensor([False, True]), None)[0].tolist()
[1, 0]
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, cast

import torch
from transformers import LogitsProcessorList

from hfbridge._step.plan.per_row import PerRowProcessor, PerRowValues, RowPlan
from hfbridge._step.run.cpu_shortcuts import greedy_choice
from hfbridge._step.run.processor_list import CheckedProcessorList, Recorder
from hfbridge.processors._stateful import is_stateful

__all__ = ["Generators", "GroupedDraw", "RowState", "Unit", "check_generators", "choose_rows", "fast_rows"]

Generators = torch.Generator | Sequence[torch.Generator] | None


def check_generators(generator: Any) -> None:
    """`TypeError` unless `generator` is None, a `torch.Generator`, or a non-empty list or tuple of them.

    >>> check_generators([torch.Generator(), 3])
    Traceback (most recent call last):
    ...
    TypeError: `generator[1]` must be a torch.Generator (one per row), got int.
    """
    if generator is None or isinstance(generator, torch.Generator):
        return
    if not isinstance(generator, (list, tuple)):
        raise TypeError(f"`generator` must be a torch.Generator or a list of them (one per row), "
                        f"got {type(generator).__name__}.")
    if not generator:
        raise ValueError("`generator` is an empty list; pass one torch.Generator per row, or a single one.")
    for index, item in enumerate(generator):
        if not isinstance(item, torch.Generator):
            raise TypeError(f"`generator[{index}]` must be a torch.Generator (one per row), got {type(item).__name__}.")


def choose_rows(scores: torch.Tensor, samples: torch.Tensor | None, generator: Generators,
                sample_rows: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(tokens, invalid)`: HF's multinomial draw for sampled rows, HF's argmax for the others.

    Args:
        scores: `(rows, vocab)` processed float32 scores.
        samples: `(rows,)` bool, True where the row samples; None: every row samples.
        generator: One generator for every row, a list with one per row, or None (the global RNG).
        sample_rows: The rows that sample, as ints (known when the options were set).

    Returns:
        `(rows,)` int64 tokens, and None, or when a row has nothing to choose (its best score -inf
        or NaN; +inf too for a sampled row) a `(rows,)` bool tensor, True for such rows, and
        nothing drawn. One host read for the check (with a generator per row, `torch.multinomial`
        reads once per row besides).
    """
    n = scores.shape[0]
    tokens, best = greedy_choice(scores)  # [N], [N]
    finite = best.abs() < float("inf")
    valid = finite if samples is None else torch.where(samples, finite, best > float("-inf"))
    if not bool(valid.all()):  # the one host read: HF's multinomial would read the rows anyway
        return tokens, ~valid
    rows = list(range(n)) if sample_rows is None else list(sample_rows)
    if not rows:
        return tokens, None
    index = torch.tensor(rows, dtype=torch.long, device=scores.device)
    picked = scores if len(rows) == n else scores.index_select(0, index)  # [S, V]
    probs = torch.nn.functional.softmax(picked, dim=-1)
    if isinstance(generator, (list, tuple)):
        drawn = torch.cat([torch.multinomial(probs[j:j + 1], 1, generator=generator[row]).squeeze(1)
                           for j, row in enumerate(rows)])  # [S]: row i from generator i only
    else:
        drawn = torch.multinomial(probs, num_samples=1, generator=cast(torch.Generator | None, generator)).squeeze(1)
    if len(rows) == n:
        return drawn, None
    return tokens.index_copy(0, index, drawn), None


class GroupedDraw:
    """The fast path's `FastDraw` for a batch drawn in parts: `tokens`, `valid`, `known_valid`, `final_scores()`."""

    def __init__(self, n: int, device: torch.device) -> None:
        self.tokens = torch.empty(n, dtype=torch.long, device=device)
        self._valid = torch.empty(n, dtype=torch.bool, device=device)
        self._parts: list[tuple[torch.Tensor, Any]] = []  # (rows, FastDraw or greedy scores)
        self._known: list[bool | None] = []

    def add(self, index: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor | bool, part: Any,
            known: bool | None) -> None:
        self.tokens.index_copy_(0, index, tokens)
        if isinstance(valid, bool):
            self._valid.index_fill_(0, index, valid)
        else:
            self._valid.index_copy_(0, index, valid)
        self._parts.append((index, part))
        self._known.append(known)

    @property
    def valid(self) -> torch.Tensor:
        return self._valid

    @property
    def known_valid(self) -> bool | None:
        if any(known is None for known in self._known):
            return None
        return all(bool(known) for known in self._known)

    def final_scores(self) -> torch.Tensor:
        """`(rows, vocab)` HF's processed scores of every row (for the error message)."""
        scores: torch.Tensor | None = None
        for index, part in self._parts:
            got = part if isinstance(part, torch.Tensor) else part.final_scores()
            if scores is None:
                scores = got.new_full((self.tokens.shape[0], got.shape[1]), float("nan"))
            scores.index_copy_(0, index, got)
        assert scores is not None
        return scores


Unit = tuple[torch.Tensor, Sequence[int], Any, bool, Any, Any]


def fast_rows(input_ids: torch.Tensor, rows: torch.Tensor, units: Sequence[Unit], *, read_only: bool,
              records: Sequence[Recorder] | None = None) -> GroupedDraw:
    """The fast path per unit of rows: `(index, row ints, processors, samples, generator, memo)` each.

    `rows` is `(rows, vocab)` (float32 and lent read-only when `read_only`); each unit's rows are
    drawn alone, as a batch of only those rows. `records`: one recorder per unit, called after each of its
    processors with the unit's `(n, vocab)` scores (`fast_draw(record=...)`).
    """
    from hfbridge._step.fast.fast_path import fast_draw

    result = GroupedDraw(rows.shape[0], rows.device)
    for number, (index, row_list, processors, samples, generator, memo) in enumerate(units):
        record = None if records is None else records[number]
        if len(row_list) == rows.shape[0]:  # every row, in order (rows of equal values, or one draw for the batch)
            part_rows, ids, lent = rows, input_ids, read_only
            if not lent:
                part_rows = part_rows.to(torch.float32, copy=True)
        elif len(row_list) == 1:
            row = row_list[0]
            part_rows, ids, lent = rows[row:row + 1], input_ids[row:row + 1], read_only  # [1, V]: a view, as alone
            if not lent:
                part_rows = part_rows.to(torch.float32, copy=True)
        else:
            ids = input_ids.index_select(0, index)  # [n, T]
            part_rows, lent = rows.index_select(0, index).to(torch.float32), False  # [n, V], a private copy
        if samples:
            drawn = fast_draw(ids, part_rows, processors, generator, memo=memo, read_only=lent, record=record)
            result.add(index, drawn.tokens, drawn.valid if drawn.known_valid is None else drawn.known_valid, drawn,
                       drawn.known_valid)
        else:
            scores = part_rows if not lent else part_rows.clone()  # [n, V]
            scores = processors(ids, scores) if record is None else \
                CheckedProcessorList(processors).run(cast(torch.LongTensor, ids), scores, record=record)
            tokens, best = greedy_choice(scores)
            result.add(index, tokens, best > float("-inf"), scores, None)
    return result


class RowState:
    """What a `Sampler` keeps for per-row options and generators: the plan, the row checks, the
    fast path's parts and their memos (one per group, or one per row with a generator per row)."""

    def __init__(self, values: PerRowValues | None, plan: RowPlan | None) -> None:
        self.values, self.plan = values, plan
        self._memos: dict[int, dict[str, Any]] = {}
        self._samples: torch.Tensor | None = None
        self._fast: tuple[tuple[torch.device, int], list] | None = None  # the plan's fast groups, for one device
        self.copies: dict[tuple, tuple[Any, int]] = {}  # (row, id of the original) -> (the row's own copy, the row)

    def check(self, rows: int, generator: Generators) -> None:
        """One value (and one generator) per row: `ValueError` unless the step has that many rows."""
        if self.values is not None:
            self.values.check_rows(rows)
        if isinstance(generator, (list, tuple)) and len(generator) != rows:
            raise ValueError(f"`generator` is a list of {len(generator)} generators, one per row, but the "
                             f"step has {rows} rows; pass one generator per row, or a single generator.")

    def units(self, processors: Any, generator: Generators, n: int, device: torch.device, start: int = 0) -> list[Unit]:
        """The fast path's parts: one per group of rows, or one per row with a generator per row.

        Each part runs the processors from place `start` of the chain on (the places before it ran once,
        on the whole batch): its group's own, and with a generator per row, a copy of each processor that
        keeps state per row for that row alone (`copies`).
        """
        plan, memos = self.plan, self._memos
        if plan is None:  # one generator per row, the same options
            assert isinstance(generator, (list, tuple))
            tail = list(processors)[start:]
            return [(torch.tensor([row], device=device), [row], self._own(row, tail, start), True, generator[row],
                     memos.setdefault(row, {})) for row in range(n)]
        units: list[Unit] = []
        if isinstance(generator, (list, tuple)):  # each row alone, with its memo (its own history)
            for number, ((_, rows), index) in enumerate(zip(plan.groups, plan.indices)):
                tail = plan.group_tail(number, start)
                units += [(index[j:j + 1], [row], self._own(row, tail, start), plan.samples[row], generator[row],
                           memos.setdefault(row, {})) for j, row in enumerate(rows)]
            return units
        if self._fast is None or self._fast[0] != (device, start):
            self._fast = ((device, start), plan.fast_groups(device, start))
        for group, (rows, index, own, samples) in enumerate(self._fast[1]):
            units.append((index, rows, LogitsProcessorList(own), samples, generator, memos.setdefault(-1 - group, {})))
        return units

    def _own(self, row: int, tail: list, start: int) -> LogitsProcessorList:
        """`tail` with `row`'s own copy of each processor that keeps state per row (`per_row_copies`)."""
        del start
        own = []
        for processor in tail:
            by_row = getattr(processor, "by_row", None)
            if by_row is not None:  # the chain's per-row copies: this row's
                processor = by_row[row]
            elif is_stateful(processor):
                processor = self._copy(row, processor)
            own.append(processor)
        return LogitsProcessorList(own)

    def _copy(self, row: int, processor: Any) -> Any:
        key = (row, id(processor))
        if key not in self.copies:
            copied = copy.deepcopy(processor)
            copied.reset()
            self.copies[key] = (copied, row)
        return self.copies[key][0]

    def per_row_copies(self, processors: list, rows: int) -> list:
        """`processors` with each processor that keeps state per row (alone, or a group's part) replaced by
        one copy per row, run on that row alone: with a generator per row the fast path draws each row
        alone, and the chain (exact mode, `explain`) then steps the very same copies."""
        result = []
        for processor in processors:
            parts = getattr(processor, "parts", None)
            if is_stateful(processor):
                owners = [(processor, list(range(rows)))]
            elif parts is not None and any(part is not None and is_stateful(part) for part, _ in parts):
                owners = [(part, index.tolist()) for part, index in parts if part is not None]
            else:
                result.append(processor)
                continue
            by_row = {row: self._copy(row, owner) for owner, owned in owners for row in owned}
            name = type(owners[0][0]).__name__
            split = PerRowProcessor(name, [(by_row[row], torch.tensor([row])) for row in sorted(by_row)], rows)
            split.by_row = by_row  # type: ignore[attr-defined]
            result.append(split)
        return result

    def samples_on(self, device: torch.device) -> torch.Tensor | None:
        """`(rows,)` bool, True where a row samples; None when every row does."""
        if self.plan is None or not self.plan.mixed:
            return None
        if self._samples is None or self._samples.device != device:
            self._samples = torch.tensor(self.plan.samples, device=device)
        return self._samples

    def sample_rows(self) -> list[int] | None:
        """The rows that sample, or None when every row does."""
        if self.plan is None or not self.plan.mixed:
            return None
        return [row for row, sample in enumerate(self.plan.samples) if sample]
