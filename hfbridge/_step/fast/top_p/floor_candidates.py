"""Top-p candidates from the last step's cut: every token above a score floor, on NumPy views.

Successive decoding steps look alike, so the last step's cut says where this one's lies. A floor a
little under it (`next_floor`: a quarter of the cut's probability) selects a few hundred tokens per
row with one NumPy comparison (a tenth of a torch comparison's cost on CPU) and a small sort,
instead of the two levels of group maxima and three `torch.topk` calls of `top_candidates`.

The floor is only a hint: `_candidates.top_p_candidates` counts the cut among these candidates and
keeps them only where the count proves that they hold it, exactly as for the best-k candidates
(every token outside scores below the floor, so below every candidate). Rows have different counts:
the shorter ones are padded with `-inf` at a token of that row that is below the floor (so
writing their keep flags to the row never touches a candidate).

>>> scores = torch.tensor([[0.0, 3.0, 1.0, 3.0], [2.0, -1.0, 5.0, 0.5]])
>>> cand, ids = candidates_above(scores, torch.tensor([1.0, 0.0]))
>>> cand.tolist(), ids.tolist()
([[3.0, 3.0, 1.0], [5.0, 2.0, 0.5]], [[1, 3, 2], [2, 0, 3]])
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["candidates_above", "next_floor"]

_MARGIN = math.log(4.0)  # the floor's score under the cut: a quarter of the cut's probability
_MAX_CANDIDATES = 2048  # a row with more above its floor takes `top_candidates` instead


def candidates_above(scores: torch.Tensor, floor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The tokens scoring at least `floor` in each row, best first (equal scores by ascending id).

    Args:
        scores: `(batch, vocab)` float32 scores on CPU.
        floor: `(batch,)` float32, one score per row.

    Returns:
        `(batch, K)` scores and `(batch, K)` int64 ids, K the largest count; a shorter row is padded
        with `-inf` scores at one of its tokens below the floor. A row with more than 2048 at or above
        its floor keeps its best 2048 (every other token scores at most the last of them, as the best-k
        candidates of `top_candidates`). None when a row has no token at or above its floor, or every
        token is, or most rows have more than 2048: the caller then selects the best k.
    """
    rows = scores.numpy(force=True)  # [N, V] a view on CPU
    limits = floor.numpy(force=True)
    found = []
    crowded = 0
    for row, limit in zip(rows, limits):
        ids = np.flatnonzero(row >= limit)  # [K] ascending
        if ids.size == 0 or ids.size == row.size:
            return None
        # a token below the floor, for the padding: the first id missing from the ascending `ids`
        if ids[0] > 0:  # the usual case: token 0 is below the floor (no pass over `ids`)
            below = 0
        else:
            gaps = np.flatnonzero(ids != np.arange(ids.size))
            below = int(gaps[0]) if gaps.size else ids.size
        if ids.size > _MAX_CANDIDATES:  # the best 2048: a token left out ties with the last at most
            crowded += 1
            if 2 * crowded > len(limits):
                return None
        ids = _descending(row[ids], ids, _MAX_CANDIDATES)  # the width is then 2048: no padding in this row
        found.append((row[ids], ids, below))
    width = max(ids.size for _, ids, _ in found)
    cand = np.full((len(found), width), -np.inf, dtype=np.float32)
    index = np.empty((len(found), width), dtype=np.int64)
    for r, (values, ids, below) in enumerate(found):
        cand[r, : ids.size], index[r, : ids.size], index[r, ids.size :] = values, ids, below
    return torch.from_numpy(cand).to(scores.device), torch.from_numpy(index).to(scores.device)


def _descending(values: np.ndarray, ids: np.ndarray, limit: int | None = None) -> np.ndarray:
    """`ids` ordered by descending `values` (float32, no NaN), equal values by ascending id: one sort of
    int64 keys, the value's order in the high bits and the id in the low ones (NumPy's vectorised
    quicksort, a fraction of a stable `argsort` of the values). With a `limit`, only the first `limit`
    of that order: the keys are distinct, so a partition then a sort of those gives the same ids as a
    sort of all of them, for a fraction of the cost when a crowded row has thousands more.

    >>> _descending(np.array([1.0, 3.0, -0.0, 3.0, 0.0], np.float32), np.array([7, 2, 5, 9, 1])).tolist()
    [2, 9, 7, 1, 5]
    >>> _descending(np.array([1.0, 3.0, -0.0, 3.0, 0.0], np.float32), np.array([7, 2, 5, 9, 1]), 3).tolist()
    [2, 9, 7]
    """
    bits = (values + np.float32(0.0)).view(np.int32).astype(np.int64)  # + 0.0: -0.0 becomes 0.0
    order = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # [K] ascending as the values, in [-2**31, 2**31)
    keys = ((2**31 - 1 - order) << 31) | ids  # descending values first; ids < 2**31
    if limit is not None and keys.size > limit:
        keys.partition(limit - 1)  # in place: the `limit` smallest keys first, in no order
        keys = keys[:limit]
    keys.sort()
    return keys & (2**31 - 1)


def next_floor(cand: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """`(batch,)` floors for the next step: a quarter of the probability of each row's last kept
    candidate, in scores (`cand`: `(batch, K)` descending; `kept`: `(batch, 1)` counts >= 1). A padded
    row whose count reaches its padding (its cut lies below its candidates) takes its last real one."""
    real = (cand > float("-inf")).sum(dim=-1, keepdim=True)  # [N, 1] a padded row's candidates
    return cand.gather(1, kept.minimum(real).clamp_(min=1) - 1).squeeze(1) - _MARGIN
