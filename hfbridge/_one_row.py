"""HF's top-p cut for a single row on CPU, from one histogram of the probabilities' exponents.

With one row (batch 1, the common case of local generation) the data is small (a 32000-token
row is 128 KB) and the fixed cost of each torch op (5-10 µs on CPU) sets the time, not the
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

Successive steps look alike, so with a memo the histogram is skipped: the tokens from one binade
under the last step's cut are compacted at once, and kept when the mass under them (the row's
float64 total less theirs) is all removed, which proves that they hold the cut.

The route declines (returns None) when it would not be cheap or the row has no distribution
(NaN or `+inf` scores, or nothing above `-inf`): the general routes then handle the row.

>>> scores = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
>>> ids, cand, keep = one_row_top_p(scores, torch.softmax(scores, -1), 0.7, 1)
>>> ids.tolist(), cand.tolist(), keep.tolist()
([[0, 1]], [[2.0, 1.0]], [[True, True]])
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ._top_p import float32, rounds_at_most

__all__ = ["MAX_SORTED", "one_row_top_p"]

MAX_SORTED = 4096  # candidates sorted at most; a flatter row goes to the general routes
_EXPONENT_SHIFT = 23  # float32: 23 mantissa bits below the exponent field
_BINADES = 256  # exponent field values of non-negative float32 numbers (a set sign bit lands above)
_MEMO_KEY = "one_row_bound"  # the bit pattern tried first: one binade under the last step's cut
_SKIP = -1  # in the memo: the last row had too many candidates, leave this one to the general routes


def one_row_top_p(scores: torch.Tensor, probs: torch.Tensor, top_p: float, at_least: int,
                  memo: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The tokens HF's `TopPLogitsWarper(top_p, at_least)` keeps in a one-row CPU batch; None to decline.

    Args:
        scores: `(1, vocab)` float32 scores, temperature applied, on CPU.
        probs: `(1, vocab)` their softmax (`torch.softmax`, HF's probabilities).
        top_p, at_least: `TopPLogitsWarper`'s `top_p` and `min_tokens_to_keep`.
        memo: A dict kept between steps. Successive steps look alike, so the tokens from one binade
            under the last step's cut are tried first; the histogram runs only when the mass under
            them is not all removed. Default: none (the histogram at once).

    Returns:
        `(ids, cand, keep)`, each `(1, K)`: the kept token ids, their scores in descending order
        (equal scores by ascending id) and an all-True mask, as `top_p_candidates` returns them;
        or None when the row has no distribution or more than `MAX_SORTED` candidates.
    """
    memo = {} if memo is None else memo
    bound = memo.get(_MEMO_KEY)
    if bound == _SKIP:
        memo[_MEMO_KEY] = None  # try again next step
        return None
    p = probs.numpy(force=True)[0]  # [V] float32, a view (force: logits that require grad)
    bits = p.view(np.uint32)  # non-negative floats order like their bit patterns
    cut, inclusive = _removal_cut(top_p)
    kept = None
    if bound is not None:
        total = float(np.add.reduce(p, dtype=np.float64))
        if not 0.0 < total < math.inf:  # NaN (NaN or +inf scores, or all -inf), or no mass
            return None
        kept = _kept(scores, p, np.flatnonzero(bits >= bound), total, cut, inclusive, at_least)
    if kept is None:
        found = _binade_candidates(p, bits, cut, inclusive)
        if found is not None:
            kept = _kept(scores, p, *found, cut, inclusive, at_least)
        if kept is None:
            memo[_MEMO_KEY] = _SKIP if found is not None and found[0].shape[0] > MAX_SORTED else None
            return None
    ids, cand, last = kept
    memo[_MEMO_KEY] = np.uint32(max((last >> _EXPONENT_SHIFT) - 1, 0) << _EXPONENT_SHIFT)
    return (torch.from_numpy(ids[None]), torch.from_numpy(cand[None]),
            torch.from_numpy(np.ones((1, ids.shape[0]), dtype=np.bool_)))


def _kept(scores: torch.Tensor, p: np.ndarray, ids: np.ndarray, total: float, cut: float, inclusive: bool,
          at_least: int) -> tuple[np.ndarray, np.ndarray, int] | None:
    """`(ids, scores, bits)` of the kept tokens among the candidates `ids` (every token above the
    others), best first, and the bit pattern of the last one's probability; None when the
    candidates are too many or too few, or the mass under them is not all removed."""
    count = ids.shape[0]
    if not at_least <= count <= MAX_SORTED:
        return None
    cand = scores.numpy(force=True)[0, ids]  # [K] float32
    order = np.argsort(-cand, kind="stable")  # descending score, equal scores by ascending id
    ids, cand, picked = ids[order], cand[order], p[ids][order]
    # HF's running sum in ascending order (`top_p_count`'s arithmetic), started by the mass under them.
    cumulative = np.add.accumulate(picked[::-1], dtype=np.float64)  # [K] ascending
    rest = max(total - float(cumulative[-1]), 0.0)
    if not ((rest <= cut) if inclusive else (rest < cut)):
        return None  # some token under the candidates is kept
    cumulative += rest  # non-decreasing: the removed ones come first
    removed = int(np.searchsorted(cumulative, cut, side="right" if inclusive else "left"))
    kept = max(count - removed, min(at_least, count))
    return ids[:kept], cand[:kept], int(picked[kept - 1:kept].view(np.uint32)[0])


def _binade_candidates(p: np.ndarray, bits: np.ndarray, cut: float, inclusive: bool
                       ) -> tuple[np.ndarray, float] | None:
    """`(ids, total)`: the ascending ids of every token from the binade that holds the cut up, and
    the row's float64 mass; None for a row without a distribution."""
    binade = bits >> _EXPONENT_SHIFT  # [V]; a set sign bit (never from softmax) lands past 255
    mass = np.bincount(binade, weights=p, minlength=_BINADES)  # [>= 256] float64
    total = float(mass.sum())
    if not 0.0 < total < math.inf:  # NaN (NaN or +inf scores, or all -inf), or no mass
        return None
    # below[e]: the mass of the binades under e, the running sum just under binade e's lowest token
    below = np.zeros(_BINADES)  # [256] float64
    np.cumsum(mass[: _BINADES - 1], out=below[1:])
    removed = below <= cut if inclusive else below < cut  # [256], True then False (non-decreasing)
    lowest = int(np.count_nonzero(removed)) - 1  # >= 0: below[0] == 0 is removed
    return np.flatnonzero(bits >= np.uint32(lowest << _EXPONENT_SHIFT)), total


@functools.lru_cache(maxsize=64)
def _removal_cut(top_p: float) -> tuple[float, bool]:
    """`rounds_at_most(float32(1 - top_p))`: a float64 running sum is removed iff `< cut` (`<=` if inclusive)."""
    return rounds_at_most(float32(1.0 - top_p))
