"""The stateful processors of a processor list (`hfbridge.processors._stateful`), per-row groups included.

A per-row group (`per_row.PerRowProcessor`) runs its own instance per group of rows; a stateful
instance there is found too. Each processor is listed once.

>>> class Count:
...     def __call__(self, input_ids, scores): return scores
...     def reset(self): pass
...     def reorder(self, beam_idx): pass
...     def rollback(self, lengths): pass
>>> count = Count()
>>> stateful_members([count, abs, count]) == [count]
True
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hfbridge.processors._stateful import is_stateful

__all__ = ["stateful_members"]


def stateful_members(processors: Iterable[Any]) -> list[Any]:
    """Every processor of `processors` that follows the stateful protocol, once each, in order."""
    found: list[Any] = []
    for processor in processors:
        if is_stateful(processor):
            found.append(processor)
        parts = getattr(processor, "parts", None)  # a per-row group's own instances
        if isinstance(parts, list):
            found += stateful_members(part for part, _ in parts if part is not None)
    unique: list[Any] = []
    for processor in found:
        if not any(processor is seen for seen in unique):
            unique.append(processor)
    return unique
