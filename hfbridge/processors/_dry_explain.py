"""Why DRY penalised what it did: each penalised token's repeat, recomputed from `input_ids` on request.

`DRYLogitsProcessor.describe_last(input_ids)` calls `dry_matches`: the same definition as the processor
(`dry.py`'s steps 1-3), written as plain Python loops over one row at a time, because it runs only when
a view asks (`explain_step`, `compare_step`), never in a step. For each penalised token it says how long
the repeat it would extend is, where the earlier occurrence of that repeat ends, and the penalty.

>>> from hfbridge.processors import DRYLogitsProcessor
>>> import torch
>>> dry = DRYLogitsProcessor(1.0, base=2.0, allowed_length=2, sequence_breakers=[])
>>> [match.text() for match in dry.describe_last(torch.tensor([[4, 1, 2, 3, 9, 4, 1, 2, 3]]))[0]]
['#9 would extend the repeat #4 #1 #2 #3 (4 tokens, also at 0-3): -1*2^(4-2) = -4']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hfbridge.processors._rows import token_label

__all__ = ["DRYMatch", "dry_matches"]


@dataclass(frozen=True)
class DRYMatch:
    """One token DRY penalised in one row, and why.

    Attributes:
        token: The penalised token id.
        length: The repeat it would extend: how many tokens before it (in the earlier occurrence) equal the
            sequence's ending, up to the breakers' limit.
        start: Where that earlier occurrence begins in the row of ``input_ids``; it ends at
            ``start + length - 1`` and ``token`` followed it there.
        exponent: ``length - allowed_length``, capped as llama.cpp caps it.
        penalty: ``multiplier * base ** exponent``, subtracted from the token's score.
        repeat: The repeated tokens (the sequence's last ``length``).
        multiplier: The row's multiplier.
        base: The row's base.
        allowed_length: The row's allowed length.
    """

    token: int
    length: int
    start: int
    exponent: int
    penalty: float
    repeat: tuple[int, ...]
    multiplier: float
    base: float
    allowed_length: int

    def text(self, label: Callable[[int], str] = token_label) -> str:
        """One line: ``'x' would extend the repeat ... (5 tokens, also at 3-7): -0.8*1.75^(5-2) = -4.29``."""
        shown = " ".join(label(token) for token in self.repeat[-8:])
        if len(self.repeat) > 8:
            shown = "… " + shown
        length = f"{self.length} token{'s' if self.length != 1 else ''}"
        return (f"{label(self.token)} would extend the repeat {shown} ({length}, also at {self.start}-"
                f"{self.start + self.length - 1}): -{self.multiplier:g}*{self.base:g}^({self.length}-"
                f"{self.allowed_length}) = -{self.penalty:.4g}")


def dry_matches(processor: Any, input_ids: torch.Tensor) -> list[list[DRYMatch]]:
    """Per row of ``input_ids`` `(rows, seq)`: the tokens `processor` (a `DRYLogitsProcessor`) penalises
    there, largest penalty first (ties: the lower id), each with the longest repeat it would extend."""
    rows, length = input_ids.shape
    settings = processor._row_settings(rows)
    multipliers, bases, caps = settings._values
    singles = processor.breakers.singles
    tails = processor.breakers.tails
    found: list[list[DRYMatch]] = []
    for row, ids in enumerate(input_ids.tolist()):
        size = settings.window(row, length)
        allowed = settings.allowed[row]
        if size <= allowed:
            found.append([])
            continue
        offset = length - size
        window = ids[offset:]
        limit = _rep_limit(window, singles, tails)
        if limit < allowed:
            found.append([])
            continue
        best: dict[int, tuple[int, int]] = {}  # token -> (length, end of the earlier occurrence)
        for end in range(size - 1):
            n = 0
            while n <= end and window[end - n] == window[size - 1 - n]:
                n += 1
            n = min(n, limit)
            token = window[end + 1]
            if n >= allowed and token not in singles and n >= best.get(token, (-1, 0))[0]:
                best[token] = (n, end)  # the latest of the longest
        matches = []
        for token, (n, end) in best.items():
            exponent = n - allowed
            if caps[row] > 0:
                exponent = min(exponent, caps[row])
            penalty = multipliers[row] * bases[row] ** exponent
            matches.append(DRYMatch(token, n, offset + end - n + 1, exponent, penalty, tuple(window[size - n:]),
                                    multipliers[row], bases[row], allowed))
        found.append(sorted(matches, key=lambda match: (-match.penalty, match.token)))
    return found


def _rep_limit(window: list[int], singles: set[int], tails: dict[tuple[int, ...], set[int]]) -> int:
    """llama.cpp's step 1 on one row: the tokens after the breaker nearest the end (none: the window's length)."""
    size = len(window)
    for position in range(size - 1, -1, -1):
        tail = -1
        if window[position] in singles:
            tail = 0
        for sequence, heads in tails.items():
            if (window[position] in heads and position + len(sequence) < size
                    and tuple(window[position + 1: position + 1 + len(sequence)]) == sequence):
                tail = max(tail, len(sequence))
        if tail >= 0:
            return size - 1 - position - tail
    return size
