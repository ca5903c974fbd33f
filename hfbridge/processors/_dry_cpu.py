"""DRY's path for CPU tensors: every row's window searched at once with NumPy.

The device path (`dry.py`) runs about 210 torch operations whatever the batch, a fixed cost that
dominates on a CPU. Here the whole batch costs a few NumPy operations on a view of `input_ids`: the
positions holding a row's last token (its last two, when every row's `allowed_length` is at least 2)
are the only possible repeats; up to `_FEW` of them are extended backwards in plain Python (the same
few calls repeated: each distinct NumPy function costs microseconds once a step's other work has
evicted its code from the caches), more by `_CHUNK` tokens a round with NumPy, so the work follows the
repeats present, not the windows' length. The breakers are looked for only as far back as the
longest repeat found. The penalties reach the scores in one indexed write. Same definition, same
results as the device path (the penalty is `multiplier * base ** e` in double, rounded once to the
scores' dtype: float32 as llama.cpp computes it).

>>> import numpy as np
>>> single = np.zeros(8, dtype=bool)
>>> rows = HostRows(start=np.array([0]), multiplier=[1.0], base=[1.1], allowed=np.array([2]), cap=np.array([930]),
...                 pair=True, shifted=False)
>>> batch_penalties(np.array([[0, 1, 2, 0, 1]]), rows, single, [])
(array([0]), array([2]), array([1.]))
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["HostRows", "batch_penalties"]

_CHUNK = 16  # tokens compared per round when extending repeats backwards
_FEW = 64  # up to this many repeat ends, plain Python
_STEPS = np.arange(_CHUNK)
_NOTHING = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64))


class HostRows(NamedTuple):
    """The live rows' DRY settings: row `b`'s window is `window[b, start[b]:]` of the window passed with them."""

    start: np.ndarray  # [B] int64, where each row's window begins (longer than allowed)
    multiplier: list[float]
    base: list[float]
    allowed: np.ndarray  # [B] int64
    cap: np.ndarray  # [B] int64, llama.cpp's cap on the exponent; 0: none
    pair: bool = False  # every row's allowed >= 2: a penalised repeat has two tokens at least
    shifted: bool = True  # some row's window starts after position 0


def batch_penalties(window: np.ndarray, rows: HostRows, single: np.ndarray,
                    groups: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(rows, tokens, amounts)`: each penalised token of each row once, with its largest penalty (float64).

    Args:
        window: `(B, M)` int, C-contiguous: the rows' last tokens, oldest first (often a view of the
            caller's ids: read only).
        rows: The rows' settings.
        single: `(vocab,)` bool, the single-token breakers.
        groups: `(heads (vocab,) bool, tail (L,) int64)` for the multi-token breakers.
    """
    start, allowed = rows.start, rows.allowed
    width = window.shape[1]
    # Where a repeat of the window's ending ends: its last token there. Every row penalising only repeats of
    # two tokens or more (allowed_length >= 2, the default), its last two tokens: far fewer places to extend.
    pair = rows.pair
    if window.shape[0] == 1:  # one row: 1-D operations, fewer of them
        begin, last = int(start[0]) if rows.shifted else 0, window[0]
        if pair:
            end = ((last[begin + 1:-1] == last[-1]) & (last[begin:-2] == last[-2])).nonzero()[0]  # 1-D: no ravel
            begin += 1
        else:
            end = (last[begin:-1] == last[-1]).nonzero()[0]
        if not end.size:
            return _NOTHING
        if begin:
            end += begin
        row = np.zeros(end.size, dtype=np.int64)
    else:
        # flat: np.nonzero on 2-D is several times slower
        if pair:
            both = (window[:, 1:-1] == window[:, -1:]) & (window[:, :-2] == window[:, -2:-1])  # [B, M - 2]
            row, end = np.divmod(np.flatnonzero(both), width - 2)
            end += 1
            if rows.shifted:
                keep = end > start[row]
                row, end = row[keep], end[keep]
        else:
            row, end = np.divmod(np.flatnonzero(window[:, :-1] == window[:, -1:]), width - 1)
            if rows.shifted:
                keep = end >= start[row]
                row, end = row[keep], end[keep]
    if row.size == 0:
        return _NOTHING
    flat = window.reshape(-1)  # [B * M], a view
    if row.size <= _FEW:
        return _few_penalties(window, rows, single, groups, row.tolist(), end.tolist())
    # the breakers cap a repeat at the row's rep_limit, and the penalty stops growing past allowed + cap:
    # lengths first under the cap alone, then the limit, which only matters up to the longest of them
    bound = np.where(rows.cap > 0, allowed + rows.cap, width)  # [B]
    lengths = _repeat_lengths(flat, width, start, bound, row, end)
    candidate = lengths >= allowed[row]
    if not candidate.any():
        return _NOTHING
    row, end, lengths = row[candidate], end[candidate], lengths[candidate]
    lengths = np.minimum(lengths, _rep_limit(window, start, int(lengths.max()), single, groups)[row])
    following = flat[row * width + end + 1]
    penalised = (lengths >= allowed[row]) & ~single[following]
    if not penalised.any():
        return _NOTHING
    row, tokens = row[penalised], following[penalised]
    exponents = lengths[penalised] - allowed[row]
    cap = rows.cap[row]
    exponents = np.where((cap > 0) & (exponents > cap), cap, exponents)
    if tokens.size > 1:
        order = np.lexsort((-exponents, tokens, row))  # by row and token, the longest repeat (largest penalty) first
        row, tokens, exponents = row[order], tokens[order], exponents[order]
        first = np.ones(tokens.size, dtype=bool)
        first[1:] = (tokens[1:] != tokens[:-1]) | (row[1:] != row[:-1])
        row, tokens, exponents = row[first], tokens[first], exponents[first]
    return row, tokens.astype(np.int64), _penalties(rows, row.tolist(), exponents.tolist())


def _repeat_lengths(flat: np.ndarray, width: int, start: np.ndarray, bound: np.ndarray, row: np.ndarray,
                    end: np.ndarray) -> np.ndarray:
    """`(N,)` for each repeat end `(row, end)`: how many tokens the sequence ending there shares with the
    row's window's ending, read backwards, at most the row's `bound` and never before its `start`."""
    lengths = np.ones(row.size, dtype=np.int64)  # the last token itself matches
    alive = np.flatnonzero(bound[row] > 1)
    steps = _STEPS  # [K]
    shift = 1  # every alive repeat matched exactly `shift` tokens so far
    while alive.size:
        at = row[alive]  # [A]
        offset = (at * width)[:, None]  # [A, 1]
        before = end[alive][:, None] - (shift + steps)  # [A, K]: the earlier sequence, backwards
        ending = (width - 1 - shift) - steps  # [K]: the window's ending, backwards (> before)
        # clip: a position before the window is outside anyway
        same = (before >= start[at][:, None]) & (flat.take(offset + before, mode="clip")
                                                == flat.take(offset + ending, mode="clip"))  # [A, K]
        run = np.where(same.all(1), _CHUNK, same.argmin(1))  # [A]: tokens matching this round
        limit = bound[at]
        reached = np.minimum(shift + run, limit)
        lengths[alive] = reached
        alive = alive[(run == _CHUNK) & (reached < limit)]
        shift += _CHUNK
    return lengths


def _few_penalties(window: np.ndarray, rows: HostRows, single: np.ndarray, groups: list[tuple[np.ndarray, np.ndarray]],
                   row: list[int], end: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`batch_penalties` for a handful of repeat ends `(row, end)`, in plain Python: the same few calls
    repeated (scalar reads of the window) instead of dozens of different NumPy functions, each of which
    costs several microseconds when the step's other work has evicted its code from the caches."""
    width = window.shape[1]
    flat = window.reshape(-1)
    starts, alloweds, caps = rows.start.tolist(), rows.allowed.tolist(), rows.cap.tolist()
    found: list[tuple[int, int, int]] = []  # (row, end, length) of the repeats long enough, before the limit
    for r, e in zip(row, end):
        allowed, cap = alloweds[r], caps[r]
        length = _one_length(flat, r * width, width, starts[r], allowed + cap if cap > 0 else width, e)
        if length >= allowed:
            found.append((r, e, length))
    if not found:
        return _NOTHING
    longest = max(length for _, _, length in found)
    if groups:
        limits = _rep_limit(window, rows.start, longest, single, groups).tolist()
    else:
        limits = [_single_limit(flat, r * width, width, starts[r], longest, single) for r in range(len(starts))]
    best: dict[tuple[int, int], int] = {}  # (row, token) -> its largest exponent
    for r, e, length in found:
        allowed, cap = alloweds[r], caps[r]
        token = int(flat[r * width + e + 1])
        length = min(length, limits[r])
        if length < allowed or single[token]:
            continue
        exponent = length - allowed if cap <= 0 else min(length - allowed, cap)
        best[r, token] = max(exponent, best.get((r, token), -1))
    if not best:
        return _NOTHING
    keys = list(best)
    return (np.array([r for r, _ in keys], dtype=np.int64), np.array([t for _, t in keys], dtype=np.int64),
            _penalties(rows, [r for r, _ in keys], list(best.values())))


def _single_limit(flat: np.ndarray, offset: int, width: int, start: int, longest: int, single: np.ndarray) -> int:
    """`_rep_limit` of one row with single-token breakers only, by scalar reads from the end: the breaker
    nearest the end matters only within the last `longest` tokens (else any value >= `longest`)."""
    for position in range(width - 1, max(start, width - longest) - 1, -1):
        if single[flat[offset + position]]:
            return width - 1 - position
    return width - start


def _one_length(flat: np.ndarray, offset: int, width: int, start: int, bound: int, end: int) -> int:
    """`_repeat_lengths` of one repeat end, in plain Python (a few ends: NumPy's fixed cost per call dominates)."""
    last = offset + width - 1
    end += offset
    start += offset
    length = 1
    while length < bound and end - length >= start and flat[end - length] == flat[last - length]:
        length += 1
    return length


def _penalties(rows: HostRows, row: list[int], exponents: list[int]) -> np.ndarray:
    """`multiplier * base ** e` in double, as llama.cpp computes it before storing a float (base >= 1: a
    longer repeat never gets a smaller penalty). Python's float power: NumPy's may differ in the last bit."""
    return np.array([rows.multiplier[r] * rows.base[r] ** e for r, e in zip(row, exponents)], dtype=np.float64)


def _rep_limit(window: np.ndarray, start: np.ndarray, longest: int, single: np.ndarray,
               groups: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """`(B,)` llama.cpp's step 1, the tokens after the breaker nearest the end (the window's length if none),
    where it is below `longest`; rows whose limit is at least `longest` may get any value >= `longest`.

    Only the window's last `longest + tail + 1` tokens can hold a breaker that matters (`tail`: the
    longest breaker's length after its first token), so only those are searched: a search over the
    whole window costs more than the rest of DRY.
    """
    rows, width = window.shape
    tail_max = max((sequence.shape[0] for _, sequence in groups), default=0)
    first = max(0, width - longest - tail_max - 1)  # the first position searched
    part = window[:, first:]  # [B, S]
    seen = part.shape[1]
    nearest = np.full(rows, -1, dtype=np.int64)  # [B]: the breaker nearest the end
    row, at = np.divmod(np.flatnonzero(single[part]), seen)
    at += first
    inside = at >= start[row]
    np.maximum.at(nearest, row[inside], at[inside])
    tail = np.zeros(rows, dtype=np.int64)  # [B]: its length after its first token
    for heads, sequence in groups:
        size = sequence.shape[0]
        if size >= seen:
            continue
        found = heads[part[:, : seen - size]]  # [B, S - L]
        for offset in range(size):
            found &= part[:, offset + 1: seen - size + offset + 1] == sequence[offset]
        row, at = np.divmod(np.flatnonzero(found), seen - size)
        at += first
        inside = at >= start[row]
        last = np.full(rows, -1, dtype=np.int64)
        np.maximum.at(last, row[inside], at[inside])
        better = (last > nearest) | ((last == nearest) & (last >= 0) & (size > tail))
        nearest, tail = np.where(better, last, nearest), np.where(better, size, tail)
    return np.where(nearest >= 0, width - 1 - nearest - tail, width - start)
