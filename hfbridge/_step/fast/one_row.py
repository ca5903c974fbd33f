"""HF's top-p cut for a single row on CPU, from one histogram of the probabilities' exponents (and
the row's top-k, `one_row_top_k`).

With one row (batch 1, the common case of local generation) the data is small (a 32000-token
row is 128 KB) and the fixed cost of each torch op on CPU sets the time, not the
data. So this route works on NumPy views of the row (no copy) and finds the cut in a few passes:

1. The float32 probabilities' exponent bits put every token in a binade, `[2**e, 2**(e+1))`;
   one probability-weighted `bincount` gives each binade's mass, summed in float64 as HF's
   `cumsum` accumulates on CPU.
2. HF removes a token when the mass at or below it (in ascending score order) rounds to float32
   `<= 1 - top_p`. Probabilities order like scores, so the mass of the binades under `e` is what
   the running sum holds just under binade `e`'s lowest token. In the highest binade `e` whose
   mass below is removed that way lies the cut: every token under it is removed, and every token
   above it is kept (the running sum under binade `e + 1` is not removed).
3. The tokens of those binades (a few hundred on real logits) are compacted once, sorted by score
   (stable: equal scores by token id, as the other routes order them), and the count is taken
   with the mass below them as the start of the running sum (`top_p_count`'s arithmetic).
4. When more than `MAX_SORTED` tokens are that high (flat rows, high temperatures), the next 8
   bits split binade `e` into 256 buckets the same way; only the bucket of the cut is sorted,
   and the kept tokens come back as a mask (everything above the bucket, the bucket's best).

Successive steps look alike, so with a memo the histogram is skipped: the tokens from one binade
under the last step's cut are compacted at once, and kept when the mass under them (the row's
float64 total less theirs) is all removed, which proves that they hold the cut.

The route declines (returns None) for a row with no distribution (NaN or `+inf` scores, or
nothing above `-inf`), a bucket too large to sort, or a `min_tokens_to_keep` beyond the kept
tokens: the general routes then handle the row.

>>> scores = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
>>> ids, cand, keep = one_row_top_p(scores, torch.softmax(scores, -1), 0.7, 1)
>>> ids.tolist(), cand.tolist(), keep.tolist()
([[0, 1]], [[2.0, 1.0]], [[True, True]])
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math

import numpy as np
import torch

from hfbridge._step.fast.pending import OneRow
from hfbridge._step.fast.top_p.mask import float32, rounds_at_most
from hfbridge._step.fast.weighted_draw import host_view

__all__ = ["MAX_SORTED", "divided", "one_row_after", "one_row_count", "one_row_kept", "one_row_top_k", "one_row_top_p"]

_NEG_INF = float("-inf")
MAX_SORTED = 4096  # tokens sorted at most; a row with more at the cut goes to the general routes
_EXPONENT_SHIFT = 23  # float32: 23 mantissa bits below the exponent field
_SUB_SHIFT = 15  # the next 8 bits split a binade into 256 buckets
_BINS = 256
_MEMO_KEY = "one_row_bound"  # the bit pattern tried first: one binade under the last step's cut


def one_row_top_p(scores: torch.Tensor, probs: torch.Tensor, top_p: float, at_least: int,
                  memo: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | torch.Tensor | None:
    """The tokens HF's `TopPLogitsWarper(top_p, at_least)` keeps in a one-row CPU batch; None to decline.

    Args:
        scores: `(1, vocab)` float32 scores, temperature applied, on CPU.
        probs: `(1, vocab)` their softmax (`torch.softmax`, HF's probabilities).
        top_p, at_least: `TopPLogitsWarper`'s `top_p` and `min_tokens_to_keep`.
        memo: A dict kept between steps. Successive steps look alike, so the tokens from one binade
            under the last step's cut are tried first; the histogram runs only when the mass under
            them is not all removed. Default: none (the histogram at once).

    Returns:
        When at most `MAX_SORTED` tokens are kept, `(ids, cand, keep)`, each `(1, K)`: the kept
        token ids, their scores in descending order (equal scores by ascending id) and an
        all-True mask, as `top_p_candidates` returns them. Otherwise the `(1, vocab)` bool mask of
        the kept tokens. None for a row without a distribution, or when more than `MAX_SORTED`
        tokens share the bucket of the cut, or `at_least` reaches past the kept tokens.
    """
    found = one_row_kept(scores, probs, top_p, at_least, memo)
    if not isinstance(found, tuple):
        return found
    ids, cand = found
    return (torch.from_numpy(ids[None]), torch.from_numpy(cand[None]),
            torch.from_numpy(np.ones((1, ids.shape[0]), dtype=np.bool_)))


_OVERFLOW_BELOW = float(np.finfo(np.float32).max) * (1 - 2.0**-40)  # `divided`: margin for the product's rounding
_GROUPS = 64  # `one_row_top_k`: tokens per group, one V/64-th of the row apart


def one_row_top_k(scores: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The `k` largest scores of a one-row CPU batch, descending (equal scores by ascending id), and
    their ids, each a `(k,)` NumPy array (`top_candidates`' answer for the row); None to decline.

    Groups of 64 tokens, one 64th of the row apart (the maximum reduces an outer axis: one vectorised
    pass), and the tail past the last whole group; `tau`, the k-th largest group maximum: those k
    groups hold k scores `>= tau`, so the k best are all `>= tau`, and only those few are sorted.
    Declines a row with NaN (torch's top-k ranks it first), a non-contiguous row, fewer than k
    groups, or more than `MAX_SORTED` scores `>= tau`.

    >>> cand, ids = one_row_top_k(torch.arange(4096.0)[None].flip(-1), 3)
    >>> cand.tolist(), ids.tolist()
    ([4095.0, 4094.0, 4093.0], [0, 1, 2])
    """
    vocab = scores.shape[-1]
    full = vocab - vocab % _GROUPS
    if scores.shape[0] != 1 or not scores.is_contiguous() or full // _GROUPS < k:
        return None
    row = host_view(scores)[0]  # [V] float32, a view
    # ufunc and method calls, not `np.` functions: each of those adds a Python layer, every step
    maxima = np.maximum.reduce(row[:full].reshape(_GROUPS, -1), axis=0)  # [V/64]: group g holds g, g + V/64, ...
    if full < vocab:
        maxima = np.append(maxima, row[full:].max())
    place = maxima.shape[0] - k
    maxima.partition(place)  # in place (a fresh array); NaN sorts last: the largest place holds one if any
    tau = maxima[place]
    if maxima[-1] != maxima[-1]:
        return None
    ids = (row >= tau).nonzero()[0]  # [M] ascending, M >= k
    if ids.shape[0] > MAX_SORTED:
        return None
    values = row[ids]
    order = (-values).argsort(kind="stable")[:k]  # descending; equal scores keep id order
    return values[order], ids[order]


def divided(values: np.ndarray, temperature: float) -> np.ndarray:
    """`(K,)` float32 scores sorted descending, divided by `float32(temperature)` (IEEE: torch's bits); a
    quotient past float32's range is inf, as torch's, without NumPy's warning.

    >>> divided(np.array([3.0e38, -1.0], dtype=np.float32), 0.5).tolist()
    [inf, -2.0]
    """
    # only a magnitude above temperature * float32's maximum overflows: the sorted row's ends hold the largest
    divisor = np.float32(temperature)
    limit = _OVERFLOW_BELOW * float(divisor)
    # Python floats: NumPy would compare in float32, casting `limit` (past float32's range for a temperature > 1)
    if abs(float(values[0])) <= limit and abs(float(values[-1])) <= limit:  # False for NaN and inf: guarded
        return values / divisor
    with np.errstate(all="ignore"):
        return values / divisor


def one_row_kept(scores: torch.Tensor, probs: torch.Tensor, top_p: float, at_least: int,
                 memo: dict | None = None) -> tuple[np.ndarray, np.ndarray] | torch.Tensor | None:
    """`one_row_top_p` with the kept tokens as NumPy arrays, `(ids, scores)` each `(K,)`, best first
    (every one kept): the one-row draw reads them as they are, and tensors are made only when
    something else reads the candidates (`_step/fast/fast_path.py`). The mask and None as `one_row_top_p`."""
    memo = {} if memo is None else memo
    p = host_view(probs)[0]  # [V] float32, a view
    bits = p.view(np.uint32)  # non-negative floats order like their bit patterns
    cut, inclusive = _removal_cut(top_p)
    bound = memo.get(_MEMO_KEY)
    kept = None
    if bound is not None:
        # torch's float64 sum: half numpy's time (which casts in buffers), the batched route's arithmetic
        total = float(probs.sum(dtype=torch.float64))
        if not 0.0 < total < math.inf:  # NaN (NaN or +inf scores, or all -inf), or no mass
            return None
        kept = _kept(scores, p, (bits >= bound).nonzero()[0], total, cut, inclusive, at_least)
    if kept is None:
        memo[_MEMO_KEY] = None
        binade = bits >> _EXPONENT_SHIFT  # [V]; a set sign bit (never from softmax) lands past 255
        mass = np.bincount(binade, weights=p, minlength=_BINS)  # [>= 256] float64
        total = float(mass.sum())
        if not 0.0 < total < math.inf:
            return None
        below = _below(mass[:_BINS], 0.0)  # [256] the mass under each binade
        lowest = int(np.count_nonzero(_removed(below, cut, inclusive))) - 1  # >= 0: below[0] == 0
        candidates = bits >= np.uint32(lowest << _EXPONENT_SHIFT)  # [V] the binade of the cut and above
        if np.count_nonzero(candidates) <= MAX_SORTED:
            kept = _kept(scores, p, np.flatnonzero(candidates), total, cut, inclusive, at_least)
        if kept is None:
            return _dense_keep(scores, p, bits, np.flatnonzero(binade == lowest), lowest, float(below[lowest]),
                               cut, inclusive, at_least)
    ids, cand, last = kept
    memo[_MEMO_KEY] = np.uint32(max((last >> _EXPONENT_SHIFT) - 1, 0) << _EXPONENT_SHIFT)
    return ids, cand


def _kept(scores: torch.Tensor, p: np.ndarray, ids: np.ndarray, total: float, cut: float,
          inclusive: bool, at_least: int) -> tuple[np.ndarray, np.ndarray, int] | None:
    """`(ids, scores, bits)` of the kept tokens among the candidates `ids` (ascending; every token
    above the others), best first, and the bit pattern of the last one's probability; None when
    the candidates are too many or too few, or the mass under them is not all removed."""
    count = ids.shape[0]
    if not at_least <= count <= MAX_SORTED:
        return None
    cand = host_view(scores)[0][ids]  # [K] float32
    order = np.argsort(-cand, kind="stable")  # descending score, equal scores by ascending id
    ids, cand = ids[order], cand[order]
    picked = p[ids]  # [K] their probabilities
    # HF's running sum in ascending order (`top_p_count`'s arithmetic), started by the mass under them.
    cumulative = np.add.accumulate(picked[::-1], dtype=np.float64)  # [K] ascending
    rest = max(total - float(cumulative[-1]), 0.0)
    if not _removed(rest, cut, inclusive):
        return None  # some token under the candidates is kept
    cumulative += rest  # non-decreasing: the removed ones come first
    removed = int(np.searchsorted(cumulative, cut, side="right" if inclusive else "left"))
    kept = max(count - removed, min(at_least, count))
    return ids[:kept], cand[:kept], int(picked.view(np.uint32)[kept - 1])


def _dense_keep(scores: torch.Tensor, p: np.ndarray, bits: np.ndarray, in_binade: np.ndarray, binade: int,
                under: float, cut: float, inclusive: bool, at_least: int) -> torch.Tensor | None:
    """`(1, vocab)` bool: the kept tokens of a row whose cut lies in `binade` (tokens `in_binade`,
    with the mass `under` it), found from 256 buckets of the binade's next bits, then a sort of
    the cut's bucket; None when that bucket is too large or `at_least` reaches past the kept."""
    low_bits = bits[in_binade]  # [n]
    bucket = (low_bits >> _SUB_SHIFT) & (_BINS - 1)  # [n]
    below = _below(np.bincount(bucket, weights=p[in_binade], minlength=_BINS), under)  # [256]
    cut_bucket = int(np.count_nonzero(_removed(below, cut, inclusive))) - 1  # >= 0: below[0] is removed
    ids = in_binade[bucket == cut_bucket]  # [m] ascending
    if ids.shape[0] > MAX_SORTED:
        return None
    ids = ids[np.argsort(-host_view(scores)[0, ids], kind="stable")]  # by score, equal by id
    cumulative = np.add.accumulate(p[ids][::-1], dtype=np.float64) + float(below[cut_bucket])  # ascending
    removed = int(np.searchsorted(cumulative, cut, side="right" if inclusive else "left"))
    keep = bits >= np.uint32((binade << _EXPONENT_SHIFT) + ((cut_bucket + 1) << _SUB_SHIFT))  # [V]
    keep[ids[: ids.shape[0] - removed]] = True
    if int(np.count_nonzero(keep)) < at_least:
        return None
    return torch.from_numpy(keep[None])


def one_row_after(previous: OneRow, top_p: float, at_least: int) -> OneRow:
    """HF's top-p on one CPU row after a filter that left `previous` (-inf everywhere else): the softmax of
    the candidates (removed ones -inf) by torch, as the batched route's, then `one_row_count`.

    >>> kept = one_row_after(OneRow(np.array([4, 1, 0]), np.array([2.0, 1.0, -2.0], dtype=np.float32)), 0.9, 1)
    >>> kept.ids.tolist(), kept.kept
    ([4, 1, 0], 2)
    """
    cand, kept = previous.cand, previous.kept
    if kept is not None:
        cand = np.where(np.arange(cand.shape[0]) < kept, cand, np.float32(_NEG_INF))  # [K]
    # torch's softmax of the 1-D row: the (1, K) row's kernel and bits; read as a list (fewer calls)
    count = one_row_count(torch.softmax(torch.from_numpy(cand), dim=-1).tolist(), top_p, at_least)
    # a token an earlier filter removed stays removed, whatever `min_tokens_to_keep` says (HF's is -inf)
    return OneRow(previous.ids, previous.cand, count if kept is None else min(count, kept))


def one_row_count(probs: list[float], top_p: float, at_least: int) -> int:
    """`candidates.top_p_count` of one row with nothing below the candidates, on Python floats: how many of
    the K float32 `probs` (a list, in descending score order) HF's top-p keeps. The same float64 sums,
    added in the same order (from the smallest up), and the same comparison: the same count.

    >>> one_row_count(torch.tensor([0.5, 0.3, 0.2]).tolist(), 0.7, 1)
    2
    """
    listed = probs[::-1]  # [K] floats (float32 values exactly), the smallest first
    # from the smallest up, the float64 mass at or below each (np.cumsum's sequential sums), ascending
    running = list(itertools.accumulate(listed))
    cut, inclusive = _removal_cut(top_p)
    if running and math.isnan(running[-1]):  # a softmax with NaN is all NaN: every token removed
        kept = 0
    else:  # the ones removed are those `<= cut` (`< cut`): a prefix of the ascending sums
        kept = len(running) - (bisect.bisect_right if inclusive else bisect.bisect_left)(running, cut)
    return max(kept, min(at_least, len(listed)))


def _below(mass: np.ndarray, start: float) -> np.ndarray:
    """`[start, start + mass[0], start + mass[0] + mass[1], ...]`: the float64 mass under each bin."""
    below = np.empty(mass.shape[0])
    below[0] = 0.0
    np.cumsum(mass[:-1], out=below[1:])
    return below + start if start else below


def _removed(running: np.ndarray | float, cut: float, inclusive: bool) -> np.ndarray | bool:
    """Whether HF removes a token with this float64 running sum (its float32 rounding `<= 1 - top_p`)."""
    return running <= cut if inclusive else running < cut


@functools.lru_cache(maxsize=64)
def _removal_cut(top_p: float) -> tuple[float, bool]:
    """`rounds_at_most(float32(1 - top_p))`: a float64 running sum is removed iff `< cut` (`<=` if inclusive)."""
    return rounds_at_most(float32(1.0 - top_p))
