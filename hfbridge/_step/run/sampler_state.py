"""What a `Sampler` step returns, and the stateful protocol over a sampler's processors.

`StepResult` is what `Sampler.step` returns. `stateful_of` finds every processor that keeps state per row
(`processors/_stateful.py`: `reset`, `reorder`, `rollback`), wherever it sits: in the chain, inside a per-row
group (`PerRowProcessor`), or copied for one row of a generator list; `reorder` and `rollback` forward the
protocol's calls to them, each with its own rows. `Sampler.reset`, `reorder` and `rollback` call these.

>>> import torch
>>> from hfbridge.processors import MirostatLogitsWarper
>>> warper = MirostatLogitsWarper(tau=1.0)
>>> found = stateful_of([warper], {})
>>> rollback(found, torch.tensor([3]))
>>> [type(processor).__name__ for processor, _ in found]
['MirostatLogitsWarper']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from hfbridge.processors._stateful import is_stateful

__all__ = ["StepResult", "invalid_flags", "reorder", "rollback", "stateful_of"]


@dataclasses.dataclass
class StepResult:
    """What `Sampler.step` returns.

    Attributes:
        tokens: `(rows,)` int64 the chosen tokens.
        scores: `(rows, vocab)` the processed scores (exact path), or None (the fast path keeps none).
        invalid: `(rows,)` on the device, in the form `FinishedRows.note_invalid` reads: bool (True for a row
            with nothing to choose: the fast path), or each row's best score (NaN or -inf: nothing to choose:
            greedy); None when the step checked already (exact sampling's draw reads its input).
        explain: Raises exact mode's error for the invalid rows (reads the device); None with `invalid`.
    """

    tokens: torch.Tensor
    scores: torch.Tensor | None
    invalid: torch.Tensor | None
    explain: Callable[[], None] | None


def invalid_flags(invalid: torch.Tensor) -> torch.Tensor:
    """`StepResult.invalid` as `(rows,)` bool, True for a row with nothing to choose (a greedy step's best
    scores: NaN or -inf)."""
    return invalid if invalid.dtype == torch.bool else ~(invalid > float("-inf"))


Stateful = list[tuple[Any, torch.Tensor | None]]  # (processor, its rows or None for the whole batch)


def stateful_of(processors: Iterable[Any], copies: Mapping[tuple, tuple[Any, int]]) -> Stateful:
    """`(processor, its rows or None for the whole batch)` for each processor that keeps state per row: in
    `processors`, their per-row groups' parts, and the per-row `copies` (`RowState.copies`); each once."""
    found: Stateful = []
    for processor in processors:
        if is_stateful(processor):
            found.append((processor, None))
        for part, index in getattr(processor, "parts", ()):
            if part is not None and is_stateful(part):
                found.append((part, index))
    for copied, row in copies.values():
        found.append((copied, torch.tensor([row])))
    unique: dict[int, tuple[Any, torch.Tensor | None]] = {}
    for processor, index in found:  # a row's copy sits in the chain and in the copies: once
        unique.setdefault(id(processor), (processor, index))
    return list(unique.values())


def reorder(found: Stateful, beam_idx: torch.Tensor) -> None:
    """Row `i` now continues what row `beam_idx[i]` was (HF's beam reorder), for every stateful processor."""
    for processor, index in found:
        processor.reorder(beam_idx if index is None else _local(beam_idx, index))


def rollback(found: Stateful, lengths: torch.Tensor) -> None:
    """Each row now has `lengths[i]` tokens: every stateful processor's state goes back to that point."""
    for processor, index in found:
        processor.rollback(lengths if index is None else lengths.index_select(0, index.to(lengths.device)))


def _local(beam_idx: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`beam_idx` for the rows `index` of the batch, in their own numbering; a row of the group must
    continue a row of the same group (one host read, only for per-row groups of a stateful processor)."""
    index = index.to(beam_idx.device)
    position = torch.full((beam_idx.shape[0],), -1, dtype=torch.long, device=beam_idx.device)
    position[index] = torch.arange(index.shape[0], device=beam_idx.device)
    local = position[beam_idx.long().index_select(0, index)]
    if bool((local < 0).any()):
        raise ValueError("`reorder`: a row would continue a row with other per-row values; beams of one prompt "
                         "must share its values.")
    return local


def refuse_phases(what: str) -> Any:
    """The stateful protocol's `reorder` / `rollback` refused with `thinking_options` (a `ValueError`)."""
    raise ValueError(f"`{what}` is not supported with `thinking_options`: each phase's sampler follows "
                     "its own rows, which beams and rolled-back rows would move; drop `thinking_options`, "
                     "or decode without beams, drafts and banned strings.")
