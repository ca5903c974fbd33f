"""Roll back the stateful processors of a chain (`hfbridge.processors._stateful`'s protocol).

A loop that takes tokens back (banned strings, assisted decoding) calls `rollback_processors` on the
chain it runs, so that every processor keeping one state per row (mirostat, adaptive-p, ...) is as if it
had never seen those tokens. A per-row chain (`PerRowProcessor`, one instance per group of rows) passes
each instance its own rows' lengths.

>>> import torch
>>> class Count:
...     def reset(self): pass
...     def reorder(self, beam_idx): pass
...     def rollback(self, lengths): print("rolled back to", lengths.tolist())
>>> rollback_processors([Count(), object()], torch.tensor([5, 7]))
rolled back to [5, 7]
1
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hfbridge.processors._stateful import is_stateful

__all__ = ["rollback_processors"]


def rollback_processors(processors: Iterable[Any], lengths: torch.Tensor) -> int:
    """Call `rollback(lengths)` on every stateful processor of `processors`; returns how many there were.

    Args:
        processors: A chain (a `LogitsProcessorList`, or any iterable of processors).
        lengths: `(rows,)` long: each row's sequence length after the rollback (prompt included).
    """
    count = 0
    for processor in processors:
        if is_stateful(processor):
            processor.rollback(lengths)
            count += 1
        for part, index in getattr(processor, "parts", ()):  # a per-row chain: one instance per group
            if part is not None and is_stateful(part):
                part.rollback(lengths.index_select(0, index.to(lengths.device)))
                count += 1
    return count
