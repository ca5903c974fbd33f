"""DRY's small-batch path: each row's window searched on the host with NumPy, for CPU tensors.

The batched path (`dry.py`) runs about 360 torch operations whatever the batch, a fixed cost that
dominates at a few rows. Here a row costs a few dozen NumPy operations on views of `input_ids`:
the positions holding the window's last token are the only possible repeats, and each round
extends the ones still matching by one token backwards, so the work follows the repeats present,
not the window's length. The penalties reach the scores in one indexed write. Same definition,
same float32 results as the batched path (the penalty is `multiplier * base ** e` in double,
rounded to float32 once, as llama.cpp computes it).

`host_rows` holds each row's settings; `penalties` returns `(rows, tokens, amounts)` to subtract.

>>> import numpy as np
>>> single = np.zeros(8, dtype=bool)
>>> row = HostRow(window=np.array([0, 1, 2, 0, 1]), multiplier=1.0, base=1.1, allowed=2, cap=930)
>>> row_penalties(row, single, [])
(array([2]), array([1.], dtype=float32))
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["HostRow", "row_penalties"]

_FEW = 8  # up to this many repeat ends, plain Python


class HostRow(NamedTuple):
    """One row's DRY settings and its window (`input_ids`' last tokens, oldest first)."""

    window: np.ndarray  # [W] int64, a view of the caller's ids (read only)
    multiplier: float
    base: float
    allowed: int
    cap: int  # llama.cpp's cap on the exponent; 0: none


def row_penalties(row: HostRow, single: np.ndarray,
                  groups: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """`(tokens, amounts)`: each penalised token once, with the largest penalty it gets (float32).

    Args:
        row: The row's settings and window (longer than `allowed`).
        single: `(vocab,)` bool, the single-token breakers.
        groups: `(heads (vocab,) bool, tail (L,) int64)` for the multi-token breakers.
    """
    window = row.window
    width = window.shape[0]
    limit = _rep_limit(window, single, groups)
    nothing = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32))
    if limit < row.allowed:
        return nothing
    ends = np.flatnonzero(window[:-1] == window[-1])  # repeats of length >= 1 end at these positions
    if ends.size == 0:
        return nothing
    # only min(n, limit) counts, and past allowed + cap the penalty no longer grows
    bound = limit if row.cap <= 0 else min(limit, row.allowed + row.cap)
    if ends.size <= _FEW:
        return _few_penalties(row, ends.tolist(), bound, single)
    lengths = np.ones(ends.size, dtype=np.int64)
    alive = np.arange(ends.size)
    shift = 1
    while alive.size and shift < bound:
        before = ends[alive] - shift
        inside = before >= 0
        alive, before = alive[inside], before[inside]
        alive = alive[window[before] == window[width - 1 - shift]]
        lengths[alive] += 1
        shift += 1
    following = window[ends + 1]
    penalised = (lengths >= row.allowed) & ~single[following]
    if not penalised.any():
        return nothing
    tokens = following[penalised]
    exponents = lengths[penalised] - row.allowed
    if row.cap > 0:
        np.minimum(exponents, row.cap, out=exponents)
    order = np.lexsort((-exponents, tokens))  # by token, the longest repeat (the largest penalty) first
    tokens, exponents = tokens[order], exponents[order]
    first = np.ones(tokens.size, dtype=bool)
    first[1:] = tokens[1:] != tokens[:-1]
    tokens, exponents = tokens[first], exponents[first]
    return tokens, _penalties(row, exponents.tolist())


def _few_penalties(row: HostRow, ends: list[int], bound: int, single: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`row_penalties` for a handful of repeat ends: plain Python beats NumPy's fixed cost per call."""
    window = row.window
    width = window.shape[0]
    longest: dict[int, int] = {}  # token -> its longest repeat
    for end in ends:
        length = 1
        while length < bound and end - length >= 0 and window[end - length] == window[width - 1 - length]:
            length += 1
        token = int(window[end + 1])
        if length >= row.allowed and not single[token] and length > longest.get(token, 0):
            longest[token] = length
    if not longest:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    exponents = [length - row.allowed for length in longest.values()]
    if row.cap > 0:
        exponents = [min(e, row.cap) for e in exponents]
    return np.fromiter(longest, dtype=np.int64, count=len(longest)), _penalties(row, exponents)


def _penalties(row: HostRow, exponents: list[int]) -> np.ndarray:
    """float32 `multiplier * base ** e`, the power in double as llama.cpp computes it (base >= 1: a
    longer repeat never gets a smaller penalty)."""
    return np.array([row.multiplier * row.base ** e for e in exponents], dtype=np.float64).astype(np.float32)


def _rep_limit(window: np.ndarray, single: np.ndarray, groups: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """llama.cpp's step 1: the tokens after the breaker nearest the end (the window's length if none)."""
    width = window.shape[0]
    hits = np.flatnonzero(single[window])
    nearest, tail = (int(hits[-1]), 0) if hits.size else (-1, 0)
    for heads, sequence in groups:
        size = sequence.shape[0]
        if size >= width:
            continue
        starts = np.flatnonzero(heads[window[: width - size]])
        for offset in range(size):
            if not starts.size:
                break
            starts = starts[window[starts + offset + 1] == sequence[offset]]
        if starts.size:
            last = int(starts[-1])
            if last > nearest or (last == nearest and size > tail):
                nearest, tail = last, size
    return width - 1 - nearest - tail if nearest >= 0 else width
