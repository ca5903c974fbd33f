"""HF's top-p cut over the whole row without sorting the vocabulary: a radix select.

HF's `TopPLogitsWarper` sorts the scores ascending, takes the running sum of their softmax and
drops every token whose running sum is `<= 1 - top_p` (a float32 comparison), keeping its last
`min_tokens_to_keep`. In that order a token's place is set by its score: among tokens of equal
float32 probability, the lower scores go first. Here `top_p_mask` finds the cut from histograms of
the probabilities' bits; a tie group split by the cut is ranked by score (`keep_highest`), as HF's
sort does. (`_step/fast/candidates.py` finds the same cut among the best-scoring tokens when they hold it.)

Only exactly equal scores are left in an order HF does not specify; there the lowest ids are kept.

Every top-p route takes one `top_p` for the batch or one per row (`TopP`: a `(rows, 1)` float64
tensor, each row's value as HF's warper of that row holds it). `removal_cut` turns either into the
float64 bound HF's float32 comparison `running <= 1 - top_p` amounts to, and `removed` / `survives`
compare a running sum with it, row by row.

>>> probs = torch.tensor([[0.5, 0.2, 0.3]])
>>> top_p_mask(probs, 0.7).tolist()
[[True, False, True]]
"""

from __future__ import annotations

import math

import torch

__all__ = ["TopP", "float32", "keep_highest", "removal_cut", "removed", "rounds_at_most", "smallest_top_p",
           "survives", "top_p_mask", "top_p_rows"]

TopP = float | torch.Tensor  # one top-p for the batch, or `(rows, 1)` float64: one per row

_INT32_MIN = -(1 << 31)


# float32: 24 significant bits; 2**-126, the smallest normal number, is 0.5 * 2**-125 in `math.frexp`.
_F32_BITS = 24
_F32_MIN_FREXP_EXP = -125
_F32_MAX = math.ldexp(2**_F32_BITS - 1, 128 - _F32_BITS)


def _f32_spacing_exp(x: float) -> int:
    """log2 of the gap between float32 numbers at the non-negative finite `x` (2**-149 below 2**-126)."""
    exponent = math.frexp(x)[1] if x else _F32_MIN_FREXP_EXP  # x = m * 2**exponent, 0.5 <= m < 1
    return max(exponent, _F32_MIN_FREXP_EXP) - _F32_BITS


def float32(x: float) -> float:
    """`x` rounded to float32 (to nearest, ties to even), as torch rounds a Python float compared
    with a float32 tensor.

    Plain float arithmetic rather than `struct`, so that `torch.compile(fullgraph=True)` traces it
    on every supported torch (torch 2.6's dynamo cannot trace `struct.pack`).

    >>> float32(0.1)
    0.10000000149011612
    """
    if x == 0.0 or not math.isfinite(x):
        return x
    step = _f32_spacing_exp(abs(x))
    rounded = math.ldexp(round(math.ldexp(abs(x), -step)), step)  # round(): ties to even
    return math.copysign(rounded if rounded <= _F32_MAX else math.inf, x)


def rounds_at_most(threshold: float) -> tuple[float, bool]:
    """`(cut, inclusive)`: a double rounds to a float32 `<= threshold` iff it is `< cut` (`<=` if inclusive).

    `threshold` is a non-negative float32; `cut` is the midpoint to the next float32 up, which rounds
    down to `threshold` (ties to even) exactly when `threshold`'s last mantissa bit is 0, that is
    when `threshold` is an even number of float32 gaps.
    """
    step = _f32_spacing_exp(threshold)
    gaps = int(math.ldexp(threshold, -step))  # threshold = gaps * 2**step exactly
    above = math.ldexp(gaps + 1, step)
    return (threshold + above) / 2, gaps % 2 == 0


def removal_cut(top_p: TopP) -> tuple[float | torch.Tensor, bool | torch.Tensor]:
    """`rounds_at_most(float32(1 - top_p))`, for one top-p or one per row (then `(rows, 1)` float64
    cuts and `(rows, 1)` bool, computed on the device without a host read).

    HF compares its float32 running sums with the Python float `1 - top_p`, which torch rounds to
    float32; the float64 `1 - top_p` of a row cast to float32 is that value (round to nearest even).

    >>> cut, inclusive = removal_cut(torch.tensor([[0.7], [0.9]], dtype=torch.float64))
    >>> [removal_cut(0.7), removal_cut(0.9)] == [(c, i) for c, i in zip(cut[:, 0].tolist(), inclusive[:, 0].tolist())]
    True
    """
    if not isinstance(top_p, torch.Tensor):
        return rounds_at_most(float32(1.0 - top_p))
    threshold = (1.0 - top_p.double()).float()  # [N, 1] float32 (1 - top_p), as HF's comparison rounds it
    above = torch.nextafter(threshold, torch.full_like(threshold, math.inf))  # the next float32 up
    cut = (threshold.double() + above.double()) / 2  # the midpoint: exact in float64
    return cut, threshold.view(torch.int32).bitwise_and(1) == 0  # [N, 1], [N, 1]: an even last bit


def removed(running: torch.Tensor, cut: float | torch.Tensor, inclusive: bool | torch.Tensor) -> torch.Tensor:
    """Where a float64 running sum rounds to a float32 `<= 1 - top_p` (HF removes the token); `removal_cut`'s
    values, one for every row or `(rows, 1)`. NaN: False."""
    if isinstance(inclusive, bool):
        return running <= cut if inclusive else running < cut
    return running <= _inclusive_cut(cut, inclusive)  # [N, 1] cuts: one comparison, not three passes


def survives(running: torch.Tensor, cut: float | torch.Tensor, inclusive: bool | torch.Tensor) -> torch.Tensor:
    """Where a float64 running sum rounds to a float32 `> 1 - top_p` (HF keeps the token). NaN: False."""
    if isinstance(inclusive, bool):
        return running > cut if inclusive else running >= cut
    return running > _inclusive_cut(cut, inclusive)  # [N, 1] cuts: one comparison, not three passes


def _inclusive_cut(cut: float | torch.Tensor, inclusive: torch.Tensor) -> torch.Tensor:
    """`(rows, 1)` float64 cuts that make every row's test inclusive: for a float64 `r`, `r < cut` iff
    `r <= nextafter(cut, -inf)` (no float64 lies between them), so a row compared with `<` takes the
    float64 just below its cut. One comparison over the running sums then serves every row (a
    `torch.where` of two comparisons costs three passes over them).

    >>> cut = torch.tensor([[0.5], [0.5]], dtype=torch.float64)
    >>> running = torch.tensor([[0.5, 0.75], [0.5, 0.75]], dtype=torch.float64)
    >>> (running > _inclusive_cut(cut, torch.tensor([[True], [False]]))).tolist()
    [[False, True], [True, True]]
    """
    cut = torch.as_tensor(cut, dtype=torch.float64, device=inclusive.device)
    return torch.where(inclusive, cut, torch.nextafter(cut, torch.full_like(cut, -math.inf)))  # [N, 1]


def top_p_rows(top_p: TopP, rows: torch.Tensor | slice) -> TopP:
    """The top-p of some rows: the same float, or those rows of a per-row `(rows, 1)` tensor."""
    return top_p[rows] if isinstance(top_p, torch.Tensor) else top_p


def smallest_top_p(top_p: TopP) -> float:
    """The smallest top-p of the batch (a host read for a per-row tensor: CPU routes only)."""
    return float(top_p.min()) if isinstance(top_p, torch.Tensor) else top_p


def top_p_mask(probs: torch.Tensor, top_p: TopP, min_tokens_to_keep: int = 1, *,
               scores: torch.Tensor | None = None, branch: bool = False) -> torch.Tensor:
    """The tokens HF's `TopPLogitsWarper(top_p, min_tokens_to_keep)` keeps, by a radix select.

    The kept tokens are those above a boundary probability `p*` plus some of those equal to it.
    For non-negative floats the bit pattern orders like the value, so `p*` is found from two or three
    probability-weighted histograms: of the high bits (which bucket holds the token where HF's
    ascending cumulative sum crosses `1 - top_p`), then of the lower bits inside that bucket. Sums
    are float64, rounded to float32 before the comparison, as HF's `cumsum` (double accumulation on
    CPU) rounds its output. Of the tokens equal to `p*`, those with the highest scores are kept (HF
    sorts by score). A row whose probabilities are NaN (its scores hold NaN or `+inf`, or are all
    `-inf`) keeps every token, as HF's comparisons with NaN remove none. Fixed shapes, no sort, no
    host-device sync.

    Args:
        probs: `(batch, vocab)` float32 probabilities, `softmax` of the scores.
        top_p: Keep the most probable tokens whose probabilities add up to `top_p`. Range [0, 1].
            One for the batch, or `(batch, 1)` float64, one per row.
        min_tokens_to_keep: Keep at least that many tokens. Default: 1.
        scores: The scores `probs` came from: they order tokens of equal probability. Default:
            none, then the lowest ids among equal probabilities are kept.
        branch: Allow one data-dependent check that skips the tie ranking when no tie group is
            split (CPU eager). Default: False, fixed shapes only.

    Returns:
        `(batch, vocab)` bool, True for the tokens kept.

    >>> top_p_mask(torch.tensor([[0.25, 0.25, 0.5]]), 0.6, scores=torch.tensor([[1.0, 2.0, 3.0]])).tolist()
    [[False, True, True]]
    """
    n, vocab = probs.shape
    # A few rows at a time: the temporaries (float64 mass, int64 bins) stay a fraction of the input,
    # and every chunk takes the small three-level histograms.
    rows = max(1, _CHUNK // max(vocab, 1))
    if rows >= n:
        return _top_p_mask_rows(probs, top_p, min_tokens_to_keep, scores, branch)
    keep = torch.empty(probs.shape, dtype=torch.bool, device=probs.device)
    for start in range(0, n, rows):
        part = slice(start, start + rows)
        keep[part] = _top_p_mask_rows(probs[part], top_p_rows(top_p, part), min_tokens_to_keep,
                                      None if scores is None else scores[part], branch)
    return keep


_CHUNK = 1 << 18  # elements per chunk of rows in `top_p_mask`


def _top_p_mask_rows(probs: torch.Tensor, top_p: TopP, min_tokens_to_keep: int,
                     scores: torch.Tensor | None, branch: bool) -> torch.Tensor:
    n, vocab = probs.shape
    cut, inclusive = removal_cut(top_p)
    bits = probs.view(torch.int32)  # [N, V]; p in [0, 1] has bits <= 0x3F800000
    mass = probs.double()  # [N, V]

    # Level 1, the high bits: the bucket of the first token (ascending) whose running sum survives
    # (masked to 31 bits so that a NaN row cannot index out of range). Then the remaining bits
    # inside that bucket, where bin 0 gathers every token below the bucket and the last bin every
    # token above, so the running sum over bins is the one over tokens. Large inputs take two
    # levels (16 + 15 bits), small ones three (11 + 10 + 10) to keep the histograms small.
    high, levels = (15, (15,)) if n * vocab > 1 << 20 else (20, (10, 10))
    bucket = (bits >> high).bitwise_and_((1 << (31 - high)) - 1).long()  # [N, V]; the mask: for NaN
    hist = mass.new_zeros(n, 1 << (31 - high)).scatter_add_(1, bucket, mass)
    prefix = _count_removed(hist.cumsum_(dim=1), cut, inclusive)  # [N, 1]; == bins when every token goes
    nothing = prefix >= hist.shape[1]
    prefix = prefix.clamp_(max=hist.shape[1] - 1).int()
    shift = high
    for width in levels:
        shift -= width
        low = ((bits >> shift) - ((prefix << width) - 1)).clamp_(0, (1 << width) + 1).long()  # [N, V]
        hist = mass.new_zeros(n, (1 << width) + 2).scatter_add_(1, low, mass)
        cum = hist.cumsum(dim=1)
        pos = _count_removed(cum, cut, inclusive).clamp_(1, 1 << width)  # [N, 1] bin inside the bucket
        prefix = (prefix << width) | (pos.int() - 1)
    boundary = prefix  # [N, 1] bits of p*
    below = cum.gather(1, pos - 1)  # [N, 1] mass strictly below p*
    p_star = boundary.view(torch.float32).double().clamp_min_(1e-300)
    ties = (hist.gather(1, pos) / p_star).round_()  # [N, 1] how many tokens equal p* (exact in float64)

    # Ascending, each tie adds p*; those whose running sum still rounds <= threshold go.
    room = (cut - below) / p_star
    if isinstance(inclusive, bool):
        gone = room.floor_() if inclusive else room.ceil_().sub_(1)
    else:
        gone = torch.where(inclusive, room.floor(), room.ceil().sub_(1))
    kept = ties - gone.clamp_(min=0).minimum(ties)  # [N, 1] ties kept, highest scores first
    boundary = boundary.masked_fill(nothing, 0x7F800000)  # above every probability: nothing kept

    # per row: always (fixed shapes; the forced keep is right for every row, only slower)
    forced = min_tokens_to_keep > 1 or isinstance(top_p, torch.Tensor) or float32(1.0 - top_p) >= float32(0.99)
    if forced:
        # HF always keeps its last `min_tokens_to_keep` tokens. With 1 that matters only when the
        # whole mass (about 1) rounds to <= threshold, impossible unless top_p is tiny.
        m = min(min_tokens_to_keep, vocab)
        floor = torch.topk(probs, m, dim=-1).values[..., -1:].view(torch.int32)  # [N, 1]
        above = (bits > floor).sum(dim=-1, keepdim=True) if m > 1 else torch.zeros_like(floor)
        need = m - above.to(kept.dtype)
        longer = (floor < boundary) | ((floor == boundary) & (need > kept))
        boundary = torch.where(longer, floor, boundary)
        kept = torch.where(longer, need, kept)
    # NaN probabilities (NaN bits are negative or above 0x7F800000): keep the whole row.
    boundary = boundary.masked_fill(torch.isnan(probs[:, :1]), _INT32_MIN)
    if not forced and branch and bool(((kept == ties) | (boundary == _INT32_MIN)).all()):
        return bits >= boundary  # no tie group is split: no ranking needed
    at_boundary = bits == boundary  # [N, V]
    if scores is None:
        rank = torch.cumsum(at_boundary, dim=-1, dtype=torch.int32)  # 1-based among the ties
        return (bits > boundary) | (at_boundary & (rank <= kept.int()))
    return (bits > boundary) | keep_highest(at_boundary, scores, kept.int())


def keep_highest(mask: torch.Tensor, scores: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Of the tokens in `mask`, the `count` with the highest scores; equal scores: lowest ids first.

    A radix select over the scores' bits (11 + 11 + 10), with token counts: fixed shapes, no sort.

    Args:
        mask: `(batch, vocab)` bool, the candidates.
        scores: `(batch, vocab)` float32; NaN is not expected (such rows are handled before).
        count: `(batch, 1)` int32 how many to keep per row (more than the candidates keeps them all).

    Returns:
        `(batch, vocab)` bool, a subset of `mask`.

    >>> keep_highest(torch.tensor([[True, True, False, True]]), torch.tensor([[-1.0, 2.0, 9.0, -3.0]]),
    ...              torch.tensor([[2]], dtype=torch.int32)).tolist()
    [[True, True, False, False]]
    """
    n = mask.shape[0]
    key = scores.view(torch.int32)
    key = torch.where(key < 0, key ^ 0x7FFFFFFF, key)  # [N, V] int32 ordered as the scores
    remaining = count.clone()  # [N, 1] still to keep at or below the prefix
    prefix = torch.zeros_like(count)  # [N, 1] the kept key's bits so far (arithmetic shifts)
    for shift, width in ((21, 11), (10, 11), (0, 10)):
        bins = 1 << width
        if shift == 21:
            digit = (key >> shift) + (bins >> 1)  # the sign bit too: signed top 11 bits, shifted to [0, bins)
            inside = mask
        else:
            digit = (key >> shift) & (bins - 1)
            inside = mask & ((key >> (shift + width)) == prefix)
        digit = digit.masked_fill_(~inside, bins).long()  # outsiders to a spare bin
        hist = torch.zeros((n, bins + 1), dtype=torch.int32, device=mask.device)
        hist = hist.scatter_add_(1, digit, torch.ones_like(digit, dtype=torch.int32))[:, :bins]
        at_or_above = hist.flip(1).cumsum(dim=1, dtype=torch.int32)  # [N, bins] from the top digit down
        j = (at_or_above < remaining).sum(dim=-1, keepdim=True).clamp_(max=bins - 1)  # [N, 1]
        above = at_or_above.gather(1, (j - 1).clamp_(min=0)).masked_fill_(j == 0, 0)
        remaining = remaining - above.int()
        chosen = (bins - 1 - j).int()
        prefix = chosen - (bins >> 1) if shift == 21 else (prefix << width) | chosen
    tie = mask & (key == prefix)
    rank = torch.cumsum(tie, dim=-1, dtype=torch.int32)
    return mask & ((key > prefix) | (tie & (rank <= remaining))) & (count > 0)


def _count_removed(cum: torch.Tensor, cut: float | torch.Tensor, inclusive: bool | torch.Tensor) -> torch.Tensor:
    """`(batch, 1)` int64 number of leading bins whose running sum rounds to float32 `<= threshold`."""
    return removed(cum, cut, inclusive).sum(dim=-1, keepdim=True)
