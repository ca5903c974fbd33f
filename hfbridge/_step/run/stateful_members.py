"""The stateful processors of a processor list (`hfbridge.processors._stateful`), per-row groups included.

A per-row group (`per_row.PerRowProcessor`) runs its own instance per group of rows; a stateful
instance there is found too. Each processor is listed once. `followed_by_caller` says whether an engine
can run one chain for several requests with a state (`follow`: vLLM's and SGLang's processors),
`continued_row` which row of its last call a request's row continues, and `follow_rows` tells the chain.

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

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from hfbridge._step.checks.caller_inputs import reads_ids
from hfbridge.processors._stateful import is_stateful

__all__ = ["continued_row", "follow_rows", "followed_by_caller", "stateful_members"]


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


def followed_by_caller(processors: Iterable[Any]) -> bool:
    """Whether one chain of `processors` can serve several requests with a state, each row told which row of the
    last call it continues (`follow`): it has stateful members, each takes `follow`, and no other processor reads
    the token ids (the members read only each row's last token, so the chain gets `(rows, 1)` ids, no padding)."""
    processors = list(processors)
    members = stateful_members(processors)
    others = [processor for processor in processors if not any(processor is member for member in members)]
    return bool(members) and all(callable(getattr(member, "follow", None)) for member in members) \
        and not reads_ids(others)


def continued_row(last: tuple[int, int] | None, length: int) -> int:
    """The row of a followed chain's last call that a request's row continues: `last` is its `(row, length then)`
    there (None: not in it); its own row when it is one token longer now, else -1 (a new state).

    >>> continued_row((3, 10), 11), continued_row((3, 10), 12), continued_row(None, 5)
    (3, -1, -1)
    """
    return last[0] if last is not None and last[1] + 1 == length else -1


def follow_rows(processors: Iterable[Any], sources: Sequence[int], device: torch.device) -> None:
    """Tell each stateful member of a followed chain that, at its next call, row `i` continues row `sources[i]` of
    its last call (-1: a new state); `sources` from `continued_row`."""
    source = torch.tensor(list(sources), dtype=torch.long, device=device)  # [G]
    for member in stateful_members(processors):
        member.follow(source)
