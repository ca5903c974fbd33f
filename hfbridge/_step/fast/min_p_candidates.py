"""HF's min-p among the candidates a top-k (or a top-p after it) left, without a pass over the vocabulary.

After a filter that left `Candidates` with `-inf` everywhere else, HF's `MinPLogitsWarper` computes
the softmax of the whole row, where every other token has probability 0: its test
`probs < min_p * probs.max()` is, up to float32 rounding, `exp(score - best) < min_p`. That is
computed here on the candidates only, in float64 from HF's own float32 difference `score - best`;
the rounding HF's arithmetic adds (its exp, the division by the row's sum, the product with
`min_p`: a few units in the last place) cannot change a decision farther than `_MARGIN` (relative)
from `min_p`. A row with a candidate that close, or with NaN or `+inf` (whose HF softmax is all
NaN), or a `min_p` so small that HF's float32 threshold underflows, is not decided here: the
caller then runs HF's arithmetic on the whole row. CPU eager only (one host read).

>>> import torch
>>> from hfbridge._step.fast.pending import Candidates
>>> pending = Candidates(torch.tensor([[4, 1, 0]]), torch.tensor([[2.0, 1.0, -2.0]]),
...                      torch.tensor([[True, True, True]]))
>>> min_p_among(pending, 0.1).keep.tolist()
[[True, True, False]]
"""

from __future__ import annotations

import math

import numpy as np
import torch

from hfbridge._step.fast.pending import Candidates, OneRow
from hfbridge._step.fast.weighted_draw import host_view

__all__ = ["min_p_among"]

_NEG_INF = float("-inf")
_MARGIN = 1e-5  # relative distance to min_p beyond which float32 rounding cannot flip a decision
_SMALLEST = 1e-30  # min_p * max stays a normal float32 (max >= 1 / K) for up to 10**7 candidates


def min_p_among(pending: Candidates | OneRow, min_p: float) -> Candidates | OneRow | None:
    """`pending` with HF's min-p (`min_tokens_to_keep=1`) applied to its kept candidates, or None
    when some row's decision lies within rounding of `min_p` or the row has no distribution.

    Args:
        pending: Candidates (or one row's `OneRow`) left by top-k or top-p, `-inf` over every other token.
        min_p: `MinPLogitsWarper.min_p`.
    """
    if not min_p >= _SMALLEST:  # HF's threshold `min_p * max` would be subnormal or 0 in float32
        return None
    if isinstance(pending, OneRow):
        return _one_row_kept(pending, min_p)
    if pending.ids.shape[0] == 1:  # one row: NumPy on views, torch's per-op cost would dominate
        return _one_row(pending, min_p)
    cand = pending.cand.masked_fill(~pending.keep, _NEG_INF)  # [N, K]; removed: probability 0
    best = cand.amax(dim=-1, keepdim=True)  # [N, 1]
    ratio = (cand - best).double().exp_()  # [N, K]; HF's float32 difference, exp in float64
    # NaN (a NaN or +inf candidate) fails both comparisons: undecided. A removed one has ratio 0.
    far = (ratio - min_p).abs_() > _MARGIN * min_p  # [N, K]
    if not bool((far | ~pending.keep).all()):
        return None
    return pending._replace(keep=pending.keep & (ratio >= min_p), all_kept=False)


def _one_row_kept(pending: OneRow, min_p: float) -> OneRow | None:
    """`min_p_among` for a `OneRow`: its survivors are its best (a prefix), and so are min-p's."""
    cand = pending.cand[: pending.kept]  # [n] float32, best first
    if cand.shape[0] == 0 or not math.isfinite(cand[0]):  # +inf: HF's softmax is all NaN, undecided
        return None
    differences = (cand - cand[0]).tolist()  # [n] HF's float32 differences, non-increasing
    margin = _MARGIN * min_p
    # the ratios fall along the row: the last kept and the first removed are the closest to min_p
    kept = len(differences)
    for place, difference in enumerate(differences):
        ratio = math.exp(difference)  # float64
        if not abs(ratio - min_p) > margin:
            return None
        if ratio < min_p:
            kept = place
            break
    return OneRow(pending.ids, pending.cand, kept)


def _one_row(pending: Candidates, min_p: float) -> Candidates | None:
    """`min_p_among` for a single row, the same arithmetic on NumPy views."""
    keep = pending.keep.numpy()[0]  # [K] bool
    cand = np.where(keep, host_view(pending.cand)[0], np.float32(_NEG_INF))  # [K] float32
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, undecided
        ratio = np.exp((cand - cand.max()).astype(np.float64))  # [K]; HF's float32 difference
        far = np.abs(ratio - min_p) > _MARGIN * min_p
    if not (far | ~keep).all():
        return None
    return pending._replace(keep=torch.from_numpy(keep & (ratio >= min_p))[None], all_kept=False)
