"""The record of a fast step drawn in parts (per-row groups, or a generator per row), put back together.

Such a step runs each part's own processors on its rows alone (`per_row_draw.fast_rows`): a group's HF
instances, a row's copy of a stateful processor, or a processor made for the draw (a temperature or a top-p
per row). `GroupedRecord` takes each part's `(processor, scores after it)` as the draw runs, finds the place
of the chain that processor stands for, and then hands the recorder the chain's processors in order, each with
the whole batch's scores: a part's rows where it ran, the scores before it where it did not (a greedy group, a
group whose values leave it off). Nothing runs twice, so nothing draws or steps twice.

>>> import torch
>>> from transformers import TopKLogitsWarper
>>> chain = [TopKLogitsWarper(1)]
>>> record = GroupedRecord(chain, 0, torch.tensor([[1.0, 2.0], [3.0, 0.0]]))
>>> unit = record.unit(torch.tensor([1]), chain)
>>> unit(chain[0], torch.tensor([[3.0, float("-inf")]]))
>>> got = []
>>> record.emit(lambda processor, scores: got.append(scores.tolist()))
>>> got
[[[1.0, 2.0], [3.0, -inf]]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hfbridge._step.plan.per_row import PerRowTemperature
from hfbridge._step.run.processor_list import Recorder

__all__ = ["GroupedRecord"]


class GroupedRecord:
    """A grouped fast step's record (see the module).

    Args:
        chain: The sampler's chain, in order.
        start: The first place the parts run (the places before it ran once on the whole batch, recorded there).
        before: `(rows, vocab)` the scores before place `start`.
        copies: The per-row copies of stateful processors, `(row, id of the original) -> (copy, row)`.
    """

    def __init__(self, chain: Sequence[Any], start: int, before: torch.Tensor,
                 copies: Mapping[tuple, tuple[Any, int]] | None = None) -> None:
        self.chain, self.start, self.before = list(chain), start, before
        self.copies = dict(copies or {})
        self.rows: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # place -> (index, (n, V) scores)

    def unit(self, index: torch.Tensor, processors: Sequence[Any]) -> Recorder:
        """The recorder of one part: the rows `index`, running `processors` (called once each, in order)."""
        places = iter(self._places(list(processors)))

        def record(processor: Any, scores: torch.Tensor) -> None:
            self.rows.setdefault(next(places), []).append((index, scores))

        return record

    def emit(self, record: Recorder) -> None:
        """`record(processor, (rows, vocab) scores)` for each place of the chain from `start` on, in order."""
        scores = self.before
        for place in range(self.start, len(self.chain)):
            output = scores.clone()  # rows the processor never ran on keep the scores before it
            for index, part in self.rows.get(place, ()):
                output[index.to(output.device)] = part.to(output.device)
            record(self.chain[place], output)
            scores = output

    def _places(self, processors: list[Any]) -> list[int]:
        """The chain's place each of a part's processors stands for (in the chain's order, some places skipped)."""
        found, place = [], self.start
        for processor in processors:
            while place < len(self.chain) and not self._stands_for(self.chain[place], processor):
                place += 1
            if place == len(self.chain):
                raise RuntimeError(f"the step ran {type(processor).__name__}, which no place of the chain holds "
                                   "(please report this: the record cannot name it)")
            found.append(place)
            place += 1
        return found

    def _stands_for(self, member: Any, processor: Any) -> bool:
        """Whether `processor`, run on a part's rows, is (a part of, a copy of) the chain's `member`."""
        if processor is member:
            return True
        leaves = {id(member)} | {id(part) for part, _ in getattr(member, "parts", ()) if part is not None}
        leaves |= {id(copied) for copied in getattr(member, "by_row", {}).values()}
        leaves |= {id(copied) for (_, original), (copied, _) in self.copies.items() if original in leaves}
        if id(processor) in leaves:
            return True
        # made for the draw (a temperature or a top-p per row, rows joined): the per-row place of its class
        if isinstance(member, PerRowTemperature):
            return type(processor).__name__ == "TemperatureLogitsWarper"
        parts = getattr(member, "parts", None)
        return parts is not None and any(part is not None and type(part) is type(processor) for part, _ in parts)
