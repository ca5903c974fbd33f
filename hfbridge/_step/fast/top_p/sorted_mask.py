"""HF's top-p cut on CPU by sorting the probabilities with NumPy, as HF sorts the scores.

HF's `TopPLogitsWarper` sorts each row ascending, takes the running sum of the probabilities
(float32 values summed in float64 by torch's CPU `cumsum`, each sum rounded to float32) and drops
the tokens whose running sum is `<= 1 - top_p`. Sorting the probabilities gives the same sequence of
running sums: equal probabilities are equal addends whatever their order, and a softmax never ranks
a lower score above a higher one. NumPy's vectorised sort (x86-simd-sort on AVX-512 and AVX2)
costs a small fraction of `torch.sort` on CPU (benchmarks/README.md), which makes the exact cut
cheaper than any radix select built from torch ops. Only the rows' order of equal probabilities is left to decide:
a tie group split by the cut keeps its highest scores, as HF's sort by score does (exactly equal
scores: lowest ids first, as `keep_highest`).

CPU eager only (NumPy, data-dependent loops); `top_p_mask(branch=True)` sends CPU rows here.

>>> probs = torch.tensor([[0.5, 0.2, 0.3]])
>>> top_p_mask_sorted(probs, 0.7).tolist()
[[True, False, True]]
"""

from __future__ import annotations

import numpy as np
import torch

from hfbridge._step.fast.top_p.mask import TopP, removal_cut, top_p_mask

__all__ = ["exact_top_p_mask", "top_p_mask_sorted"]

_CHUNK = 1 << 19  # elements sorted at a time: one reused buffer, a fraction of the input
_BLOCK = 1024  # tokens per block of the running sum: block totals first, then one block token by token


def exact_top_p_mask(probs: torch.Tensor, top_p: TopP, min_tokens_to_keep: int = 1, *,
                     scores: torch.Tensor | None = None) -> torch.Tensor:
    """HF's top-p cut over whole rows, found exactly: this NumPy sort on CPU, the radix select with
    its one data-dependent check elsewhere (`top_p_mask(branch=True)`). Eager only.

    >>> exact_top_p_mask(torch.tensor([[0.5, 0.2, 0.3]]), 0.7).tolist()
    [[True, False, True]]
    """
    if probs.device.type == "cpu":
        return top_p_mask_sorted(probs, top_p, min_tokens_to_keep, scores=scores)
    return top_p_mask(probs, top_p, min_tokens_to_keep, scores=scores, branch=True)


def top_p_mask_sorted(probs: torch.Tensor, top_p: TopP, min_tokens_to_keep: int = 1, *,
                      scores: torch.Tensor | None = None) -> torch.Tensor:
    """The tokens HF's `TopPLogitsWarper(top_p, min_tokens_to_keep)` keeps, by a NumPy sort.

    Args:
        probs: `(batch, vocab)` float32 CPU probabilities (non-negative, or NaN), `softmax` of the scores.
        top_p: Keep the most probable tokens whose probabilities add up to `top_p`. Range [0, 1].
            One for the batch, or `(batch, 1)` float64, one per row.
        min_tokens_to_keep: Keep at least that many tokens. Default: 1.
        scores: The scores `probs` came from: they order tokens of equal probability. Default:
            none, then the lowest ids among equal probabilities are kept.

    Returns:
        `(batch, vocab)` bool CPU tensor, True for the tokens kept. A row holding NaN keeps every
        token, as HF's comparisons with NaN remove none.

    >>> top_p_mask_sorted(torch.tensor([[0.25, 0.25, 0.5]]), 0.6, scores=torch.tensor([[1.0, 2.0, 3.0]])).tolist()
    [[False, True, True]]
    """
    n, vocab = probs.shape
    if n == 0 or vocab == 0:
        return torch.ones(probs.shape, dtype=torch.bool)
    p = probs.detach().numpy()  # [N, V], the caller's memory: read only
    cut, inclusive = _per_row(*removal_cut(top_p), n)  # [N, 1] each
    at_least = max(1, min(min_tokens_to_keep, vocab))
    boundary = np.empty((n, 1), np.float32)  # [N, 1] the smallest kept probability
    split: list[tuple[int, int]] = []  # (row, ties kept) for tie groups the cut splits
    rows = max(1, _CHUNK // max(vocab, 1))
    buffer = np.empty((min(rows, n), vocab), np.float32)
    for start in range(0, n, rows):
        source = p[start:start + rows]  # [R, V]
        part = buffer[: source.shape[0]]
        # Only the smallest tokens, up to the cut, need their order: the others are lowered to a
        # ceiling estimated from a sample (sorting equal values is cheap). If the cut lands on the
        # ceiling after all, the row is sorted again whole.
        cuts, inclusives = cut[start:start + rows], inclusive[start:start + rows]  # [R, 1]
        ceiling = _ceiling(source, cuts)  # [R, 1]
        np.minimum(source, ceiling, out=part)
        # Non-negative floats order as their bits: sorting those as int32 is faster. A NaN sorts
        # first (sign bit set) or last.
        part.view(np.int32).sort(axis=-1)
        first = _first_kept(part, cuts, inclusives, at_least)  # [R] index of the smallest kept token
        r = np.arange(part.shape[0])
        for i in np.flatnonzero(part[r, first] >= ceiling[:, 0]):
            np.copyto(part[i], source[i])
            part[i].view(np.int32).sort()
            first[i] = _first_kept(part[i:i + 1], cuts[i:i + 1], inclusives[i:i + 1], at_least)[0]
        nan = np.isnan(part[:, 0]) | np.isnan(part[:, -1])  # [R]
        boundary[start:start + part.shape[0], 0] = np.where(nan, -np.inf, part[r, first])
        below = part[r, np.maximum(first - 1, 0)]  # [R] the largest removed probability
        for i in np.flatnonzero((first > 0) & (below == part[r, first]) & ~nan):
            split.append((start + int(i), int(np.searchsorted(part[i], part[i, first[i]], "right")) - int(first[i])))
    keep = np.less(p, boundary)  # [N, V]
    np.logical_not(keep, out=keep)  # not `>=`: a NaN is kept
    for row, kept in split:
        ties = np.flatnonzero(p[row] == boundary[row, 0])  # ascending ids
        if scores is not None:  # highest scores first; stable: equal scores keep id order
            ties = ties[np.argsort(-scores[row].detach().numpy()[ties], kind="stable")]
        keep[row, ties[kept:]] = False
    return torch.from_numpy(keep)


def _per_row(cut: float | torch.Tensor, inclusive: bool | torch.Tensor, n: int) -> tuple[np.ndarray, np.ndarray]:
    """`removal_cut`'s values as `(rows, 1)` NumPy arrays: float64 cuts and bool."""
    if isinstance(cut, torch.Tensor):
        assert isinstance(inclusive, torch.Tensor)
        return cut.numpy(force=True), inclusive.numpy(force=True)
    return np.full((n, 1), cut), np.full((n, 1), inclusive)


def _removed(running: np.ndarray, cut: np.ndarray, inclusive: np.ndarray) -> np.ndarray:
    """Where a float64 running sum rounds to float32 `<= 1 - top_p`: `< cut`, `<= cut` where
    `inclusive` (`(rows, 1)` each, as the rows of `running`)."""
    return np.where(inclusive, running <= cut, running < cut)


_SAMPLE = 128  # every 128th token estimates where the cut lies


def _ceiling(source: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """`(rows, 1)` float32 above the cut's probability in each row, likely: from a sorted sample,
    the probability at which the sample's running sum (scaled) passes the cut by a wide margin.
    +inf (no ceiling) for short rows and where the sample runs out."""
    rows, vocab = source.shape
    if vocab < 64 * _SAMPLE:
        return np.full((rows, 1), np.inf, np.float32)
    sample = np.ascontiguousarray(source[:, ::_SAMPLE])  # [R, S]
    sample.view(np.int32).sort(axis=-1)
    estimate = np.cumsum(sample, axis=-1, dtype=np.float64) * _SAMPLE  # [R, S]
    rank = (estimate < cut).sum(axis=-1)  # [R]
    rank += rank // 4 + 8  # about +25% of the mass below: several standard errors of the estimate
    out = np.full((rows, 1), np.inf, np.float32)
    inside = rank < sample.shape[1]
    out[inside, 0] = sample[inside, rank[inside]]
    return out


def _first_kept(part: np.ndarray, cut: np.ndarray, inclusive: np.ndarray, at_least: int) -> np.ndarray:
    """`(rows,)` index of the first token HF keeps in the ascending rows `part`."""
    vocab = part.shape[1]
    return vocab - np.maximum(vocab - _count_removed(part, cut, inclusive), at_least)


def _count_removed(part: np.ndarray, cut: np.ndarray, inclusive: np.ndarray) -> np.ndarray:
    """`(rows,)` how many of the sorted `part`'s leading tokens HF removes: running sums (float64)
    that round to float32 `<= 1 - top_p` (`< cut`, or `<= cut` when inclusive; `(rows, 1)` each).

    The running sum is non-decreasing, so the removed tokens are a prefix: whole blocks whose last
    running sum is removed, then the tokens of the next block, summed one by one.
    """
    rows, vocab = part.shape
    count = -(-vocab // _BLOCK)  # blocks, the last one maybe short
    ends = np.full((rows, count), np.inf)  # [R, B] running sum at each block's last token
    done = 0
    for stop in [count * k // 8 for k in range(1, 9)]:  # the running sum crosses early: sum only that far
        if stop <= done:
            continue
        lo, hi = done * _BLOCK, min(stop * _BLOCK, vocab)
        full = (hi - lo) // _BLOCK
        totals = part[:, lo:lo + full * _BLOCK].reshape(rows, full, _BLOCK).sum(axis=-1, dtype=np.float64)
        if lo + full * _BLOCK < hi:
            totals = np.concatenate([totals, part[:, lo + full * _BLOCK:hi].sum(axis=-1, dtype=np.float64,
                                                                             keepdims=True)], axis=-1)
        if done:
            totals[:, 0] += ends[:, done - 1]  # carry on the running sum, as one `cumsum` would
        np.cumsum(totals, axis=-1, out=ends[:, done:stop])
        done = stop
        last = ends[:, done - 1:done]  # [R, 1]
        if not _removed(last, cut, inclusive).any():  # NaN: crossed, never removed
            break
    blocks = _removed(ends, cut, inclusive).sum(axis=-1)  # [R] blocks removed whole
    before = np.where(blocks > 0, ends[np.arange(rows), np.maximum(blocks - 1, 0)], 0.0)  # [R]
    index = blocks[:, None] * _BLOCK + np.arange(_BLOCK)  # [R, BLOCK] the next block's tokens
    inside = index < vocab
    values = np.take_along_axis(part, np.minimum(index, vocab - 1), axis=-1)  # [R, BLOCK]
    # one token at a time from the blocks before, as HF's sequential float64 `cumsum`
    running = np.cumsum(np.concatenate([before[:, None], values], axis=-1), axis=-1, dtype=np.float64)[:, 1:]
    removed = _removed(running, cut, inclusive) & inside
    return blocks * _BLOCK + removed.sum(axis=-1)
