"""The loops' side of the stateful-processor protocol (`hfbridge.processors._stateful`): who calls what, when.

A stateful processor keeps one state per row across steps (mirostat's `mu`, a count of tokens), so
every loop that moves rows or takes tokens back tells it:

- `generate` calls `reset()` on each one when a call starts (your own processors may have run before);
- beam search calls `reorder(beam_idx)` each step, where HF's loop reorders the model's cache;
- assisted and prompt-lookup decoding call `rollback(lengths)` before the target's processors run
  again, to the last length whose tokens they saw and kept: what they saw of rejected draft tokens (and
  of HF's prompt-lookup screening, which runs them on candidate tokens) is forgotten. After a rejected
  draft token that is the length before the target's own last token, and the step at that length is
  replayed on the target's logits (`hf_loops/assisted_stand_ins.py`), so the next step continues it.

`Stateful` asks the call's `Sampler` once whether any processor keeps state, so a loop without one pays
nothing, and goes through the `Sampler`'s own `reset` / `reorder` / `rollback`, which reach every stateful
processor (inside per-row groups too, with each group's own rows).

>>> import torch
>>> from hfbridge._step.run.sampler import Sampler
>>> stateful = Stateful(Sampler(do_sample=True, mirostat=2))
>>> bool(stateful), bool(Stateful(Sampler(do_sample=True, top_k=5)))
(True, False)
"""

from __future__ import annotations

import torch

from hfbridge._step.run.sampler import Sampler

__all__ = ["Stateful"]


class Stateful:
    """The protocol's three calls on a `Sampler`'s stateful processors (nothing when it has none)."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.present = sampler.is_stateful

    def __bool__(self) -> bool:
        return self.present

    def reset(self) -> None:
        """Forget every row: a fresh call."""
        if self.present:
            self.sampler.reset()

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Row `i` now continues what row `beam_idx[i]` was (HF's beam reorder)."""
        if self.present:
            self.sampler.reorder(beam_idx)

    def rollback(self, lengths: torch.Tensor) -> None:
        """Row `i`'s sequence now has `lengths[i]` tokens; what came after is forgotten."""
        if self.present:
            self.sampler.rollback(lengths)
