"""The loops' side of the stateful-processor protocol (`hfbridge.processors._stateful`): who calls what, when.

A stateful processor keeps one state per row across steps (mirostat's `mu`, a count of tokens), so
every loop that moves rows or takes tokens back tells it:

- `generate` calls `reset()` on each one when a call starts (your own processors may have run before);
- beam search calls `reorder(beam_idx)` each step, where HF's loop reorders the model's cache;
- assisted and prompt-lookup decoding call `rollback(lengths)` before the target's processors run
  again, to the length of the sequence accepted so far: what they saw of rejected draft tokens (and of
  HF's prompt-lookup screening, which runs them on candidate tokens) is forgotten.

`Stateful` finds them once per call (a per-row group's instances included), so a loop without one
pays nothing.

>>> import torch
>>> class Count:
...     def __init__(self): self.n = 5
...     def __call__(self, input_ids, scores): return scores
...     def reset(self): self.n = 0
...     def reorder(self, beam_idx): pass
...     def rollback(self, lengths): pass
>>> count = Count()
>>> stateful = Stateful([count, lambda ids, scores: scores])
>>> len(stateful.processors), bool(stateful)
(1, True)
>>> stateful.reset(); count.n
0
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hfbridge._step.stateful_members import stateful_members

__all__ = ["Stateful"]


class Stateful:
    """The stateful processors of a processor list, and the protocol's three calls on all of them."""

    def __init__(self, processors: Iterable[Any]):
        self.processors = stateful_members(processors)

    def __bool__(self) -> bool:
        return bool(self.processors)

    def reset(self) -> None:
        """Forget every row: a fresh call."""
        for processor in self.processors:
            processor.reset()

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Row `i` now continues what row `beam_idx[i]` was (HF's beam reorder)."""
        for processor in self.processors:
            processor.reorder(beam_idx)

    def rollback(self, lengths: torch.Tensor) -> None:
        """Row `i`'s sequence now has `lengths[i]` tokens; what came after is forgotten."""
        for processor in self.processors:
            processor.rollback(lengths)
