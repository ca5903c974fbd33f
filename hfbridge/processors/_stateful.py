"""The protocol of processors that keep state per row across steps (mirostat, adaptive-p, a thinking budget).

A stateless processor sees everything it needs in `(input_ids, scores)`. A stateful one carries a value
per row from one call to the next (mirostat's `mu`, adaptive-p's running average, the budget's count),
so a loop that moves rows around or takes tokens back must tell it. Three calls, all sync-free:

- `reset()`: forget every row (a fresh `sample_step` call, a new `generate`);
- `reorder(beam_idx)`: `(rows,)` long, row `i` now continues what row `beam_idx[i]` was (HF's beam
  search reorders the batch this way every step);
- `rollback(lengths)`: `(rows,)` long, each row's sequence now has `lengths[i]` tokens (prompt
  included); its state becomes what it was when the sequence had that many tokens, as if the tokens
  after had never been seen (assisted decoding rejects drafted tokens; banned strings rewind).

A fourth call is optional: `follow(source)`, `(rows,)` long, at the next call only row `i` continues row
`source[i]` of the last call (-1: a new sequence) by the caller's word, not by its tokens (mirostat 1 and 2
and adaptive-p take it; hfbridge's vLLM processor shares one chain among requests with it).

hfbridge's loops call these on every processor that has them (`is_stateful`). In transformers' own
`generate`, which never calls them, a stateful processor still follows its rows by matching each
call's `input_ids` against the sequences it saw.

>>> import torch
>>> class Count:
...     def reset(self): self.n = None
...     def reorder(self, beam_idx): pass
...     def rollback(self, lengths): pass
>>> is_stateful(Count()), is_stateful(object())
(True, False)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

__all__ = ["StatefulLogitsProcessor", "is_stateful"]


@runtime_checkable
class StatefulLogitsProcessor(Protocol):
    """A logits processor with one state per row; see the module for what each call means."""

    def reset(self) -> None: ...

    def reorder(self, beam_idx: torch.Tensor) -> None: ...

    def rollback(self, lengths: torch.Tensor) -> None: ...


def is_stateful(processor: object) -> bool:
    """Whether `processor` follows the stateful protocol (has `reset`, `reorder` and `rollback`)."""
    return isinstance(processor, StatefulLogitsProcessor)
