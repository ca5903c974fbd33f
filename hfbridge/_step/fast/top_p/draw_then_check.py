"""HF's top-p draw when many tokens survive, without finding the cut: draw, then check the token.

When thousands of tokens survive top-p (flat rows, temperature 1), no small candidate set holds
the cut, and finding it exactly over the vocabulary (`_step/fast/top_p/sorted_mask.py`) costs tens of reads of
the row. Sampling does not need the cut, only HF's distribution: the softmax restricted to the
tokens HF keeps. `draw_top_p` draws from the whole softmax and accepts the token if HF keeps it,
else draws that row again (rejection sampling: the accepted token has exactly the restricted
distribution; about `1 / top_p` draws per row on average).

Whether HF keeps a token: where candidates were tried (`TopPTry`), a row whose candidates decide
its cut draws among its kept candidates, as the candidates' route does (a batch of rows with
distinct top-p or temperatures, some keeping thousands of tokens and most a few hundred, checks
the former only); the best-scoring candidates that surely survive are accepted at once. Any other
token is checked exactly (`kept_exactly`): HF's running sum at its place in the ascending order is
the mass of the lower scores plus its own tie group, compared with `1 - top_p` as `top_p_count` does.
The check runs on NumPy views of the row: a NumPy comparison costs a tenth of torch's on CPU, so
checking every draw costs about two reads of the logits in all.

`top_p_route` chooses between the routes: candidates that prove the cut, or the draw (skipping
the candidates when a bound from the partial sums shows that they cannot hold it), or neither.
CPU eager only (reads flags).

>>> import torch
>>> scores = torch.randn(2, 50_000, generator=torch.Generator().manual_seed(0))
>>> probs = torch.softmax(scores, dim=-1)
>>> plan = top_p_route(scores, probs, 0.9, 1)
>>> type(plan).__name__, plan.tried is None
('TopPDraw', True)
>>> tokens, valid = draw_top_p(scores, probs, None, 0.9, 1, torch.Generator().manual_seed(0))
>>> tokens.shape, bool(valid.all())
(torch.Size([2]), True)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from hfbridge._step.fast.candidates import (
    TopPTry,
    Total,
    candidates_cannot_hold,
    certified_total,
    proved_last,
    top_p_candidates,
)
from hfbridge._step.fast.top_p.mask import TopP, removal_cut, smallest_top_p, top_p_mask, top_p_rows
from hfbridge._step.fast.weighted_draw import draw, pick

__all__ = ["TopPDraw", "draw_top_p", "kept_exactly", "top_p_route"]

_ROUNDS = 32  # draws per row before the rows still refused take the radix select
_MIN_TOP_P = 0.5  # below, rows draw again too often (about 1 / top_p draws per row): find the cut
_BLOCK = 16  # probabilities per float32 partial sum in `kept_exactly` (as in `certified_total`)
_SLACK = 16 * 2.0**-24  # its relative error bound, with room for the float64 sum (`_step/fast/candidates.py`)
_GROUP = 32  # partial sums per group in `_draw_by_partial_sums`
# Candidates are skipped when they provably miss the cut of more than this share of the rows: below it,
# the rows they decide draw with no check (one exact check over the row costs about what a try costs).
_HOPELESS_SHARE = 0.25


class TopPDraw(NamedTuple):
    """A top-p left to the draw (`draw_top_p`): what `top_p_route` found, and the warper's options."""

    tried: TopPTry | None  # the candidates tried (None: skipped, they could not hold the cut)
    top_p: TopP  # one, or `(batch, 1)` float64: one per row
    at_least: int  # `min_tokens_to_keep`
    total: Total  # `certified_total(probs)`


def top_p_route(scores: torch.Tensor, probs: torch.Tensor, top_p: TopP, at_least: int,
                memo: dict | None = None) -> TopPTry | TopPDraw | None:
    """How the fast path samples HF's top-p on CPU: the candidates' cut, the draw, or neither.

    Args:
        scores: `(batch, vocab)` float32 scores, temperature applied.
        probs: `(batch, vocab)` their softmax.
        top_p, at_least: `TopPLogitsWarper`'s `top_p` (or `(batch, 1)` float64, one per row) and
            `min_tokens_to_keep`.
        memo: As in `top_p_candidates`.

    Returns:
        A proved `TopPTry` (the candidates hold every row's cut); a `TopPDraw` when the draw can
        check its tokens (`top_p >= 0.5`, every row has a distribution, and `min_tokens_to_keep`
        is 1 or within the candidates that surely survive); else None: find the cut over the row.
        Either way the tokens follow HF's distribution: candidates are skipped where they provably
        fail for more than a quarter of the rows (one bound), and the rows they decide draw among them.
    """
    total = certified_total(probs)
    # The bound costs about half a read of the logits: tried when the last step's candidates failed.
    if (at_least == 1 and _drawable(top_p, at_least, total, None) and not proved_last(memo)
            and candidates_cannot_hold(total, top_p, probs.shape[-1], _HOPELESS_SHARE)):
        return TopPDraw(None, top_p, at_least, total)
    tried = top_p_candidates(scores, probs, top_p, at_least, memo, total,
                             partial=at_least == 1 and _drawable(top_p, at_least, total, None))
    if tried is None or tried.proved:
        return tried
    if _drawable(top_p, at_least, total, tried):
        return TopPDraw(tried, top_p, at_least, total)
    return None


def _drawable(top_p: TopP, at_least: int, total: Total, tried: TopPTry | None) -> bool:
    """When `draw_top_p` applies: `top_p >= 0.5` (below, rows draw again too often), every row has a
    distribution (a row with NaN, +inf or only -inf scores has a NaN softmax, and total), and
    `min_tokens_to_keep` is 1 or within the candidates that surely survive."""
    if smallest_top_p(top_p) < _MIN_TOP_P or not bool((total.approx > 0).all()):
        return False
    return at_least == 1 or (tried is not None and bool((tried.surely_kept().sum(dim=-1) >= at_least).all()))


def draw_top_p(scores: torch.Tensor, probs: torch.Tensor, tried: TopPTry | None, top_p: TopP, at_least: int,
               generator: torch.Generator | None = None, *,
               total: Total | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One token per row from HF's top-p distribution, by rejection; None where it does not apply.

    Args:
        scores: `(batch, vocab)` float32 scores, temperature applied (they order HF's sort).
        probs: `(batch, vocab)` their softmax.
        tried: The candidates `top_p_candidates` tried last (the best scores of each row), or None.
        top_p, at_least: `TopPLogitsWarper`'s `top_p` (or `(batch, 1)` float64, one per row) and
            `min_tokens_to_keep`.
        generator: Seeds the draws. Default: torch's global generator.
        total: `certified_total(probs)`, if known.

    Returns:
        `(batch,)` int64 tokens and `(batch,)` bool validity (all True), or None when a row has no
        distribution (NaN, `+inf` or only `-inf` scores), `at_least > 1` reaches past the
        candidates that surely survive, or `top_p < 0.5`: the caller then finds the cut.
    """
    n, vocab = probs.shape
    if total is None:
        total = certified_total(probs)
    # With at_least == 1 nothing needs the candidates: the best token's running sum is the total.
    if not _drawable(top_p, at_least, total, tried):
        return None
    decided = None if tried is None else tried.decided().squeeze(1)  # [N] rows whose candidates hold the cut
    rows = torch.arange(n, device=probs.device)
    if tried is not None and decided is not None and bool(decided.any()):
        # Rows whose candidates hold the cut draw among their kept candidates, as a proved try draws;
        # only the others draw from the whole softmax and check their token.
        weights = (tried.cand - tried.cand[:, :1]).exp_().mul_(tried.keep().view(torch.uint8))  # [N, K] as Candidates
        tokens = tried.ids.gather(1, pick(weights, generator)[0][:, None]).squeeze(1)  # [N]
        rows = rows[~decided]
        if rows.numel() == 0:
            return tokens, torch.ones(n, dtype=torch.bool, device=probs.device)
        tokens[rows] = _draw_by_partial_sums(probs, total.partial, rows, generator)
    else:
        tokens = _draw_by_partial_sums(probs, total.partial, None, generator)  # [N]
    surely = None if tried is None else tried.surely_kept()  # [N, K]
    cut, inclusive = removal_cut(top_p)
    cuts = [cut] * n if isinstance(cut, float) else cut[:, 0].tolist()  # per row (CPU: no device read)
    inclusives = [inclusive] * n if isinstance(inclusive, bool) else inclusive[:, 0].tolist()
    scores_np, probs_np = scores.numpy(force=True), probs.numpy(force=True)  # views of CPU tensors
    work = (np.empty(vocab, bool), np.empty(vocab, np.float32))  # the checks' scratch rows
    refused_below = [-math.inf] * n  # per row, the highest score refused so far: every lower one is too
    for _ in range(_ROUNDS):
        token = tokens[rows]  # [R]
        if tried is None or surely is None or decided is None:
            accept, check = [False] * rows.numel(), [True] * rows.numel()
        else:
            sure = ((tried.ids[rows] == token[:, None]) & surely[rows]).any(dim=-1)  # [R]
            accept = sure.tolist()
            check = (~sure & ~decided[rows]).tolist()  # a decided row refuses every token it did not keep
        for i, (row, t) in enumerate(zip(rows.tolist(), token.tolist())):
            if check[i]:
                score = float(scores_np[row, t])
                if score >= refused_below[row]:
                    accept[i] = kept_exactly(scores_np[row], probs_np[row], t, cuts[row], inclusives[row], work)
                if not accept[i]:
                    refused_below[row] = max(refused_below[row], score)
        rows = rows[~torch.tensor(accept, dtype=torch.bool, device=rows.device)]
        if rows.numel() == 0:
            return tokens, torch.ones(n, dtype=torch.bool, device=probs.device)
        tokens[rows] = _draw_by_partial_sums(probs, total.partial, rows, generator)
    # Rows refused this often keep little mass in reach: find their cut over the whole row.
    keep = top_p_mask(probs[rows], top_p_rows(top_p, rows), at_least, scores=scores[rows], branch=True)
    tokens[rows] = draw(probs[rows].masked_fill_(~keep, 0.0), generator)
    return tokens, torch.ones(n, dtype=torch.bool, device=probs.device)


def _draw_by_partial_sums(probs: torch.Tensor, partial: torch.Tensor, rows: torch.Tensor | None,
                          generator: torch.Generator | None) -> torch.Tensor:
    """`draw(probs[rows])` in three levels, reusing the sums of 16 tokens of `certified_total`: a
    group of 32 such sums, then one sum, then a token. `(rows,)` int64; all rows when `rows` is None."""
    vocab = probs.shape[-1]
    if rows is not None:
        partial = partial[rows]  # [R, P]
    n, sums = partial.shape
    width = vocab // _BLOCK  # sum g < width holds tokens g + j * width; the last, the tail after 16 * width
    pad = -sums % _GROUP
    padded = torch.nn.functional.pad(partial, (0, pad)) if pad else partial  # [R, G * 32]
    group, _ = pick(padded.view(n, -1, _GROUP).sum(dim=-1), generator)  # [R]
    slots = group[:, None] * _GROUP + torch.arange(_GROUP, device=probs.device)  # [R, 32]
    chosen = slots.gather(1, pick(padded.gather(1, slots), generator)[0][:, None])  # [R, 1]
    spread = torch.arange(_BLOCK, device=probs.device)  # [16]
    ids = torch.where(chosen < width, chosen + spread * width, _BLOCK * width + spread)  # [R, 16]
    inside = ids < vocab
    ids = ids.clamp_(max=vocab - 1)
    weights = probs.gather(1, ids) if rows is None else probs[rows[:, None], ids]  # [R, 16]
    return ids.gather(1, pick(weights.mul_(inside), generator)[0][:, None]).squeeze(1)


def kept_exactly(scores: np.ndarray, probs: np.ndarray, token: int, cut: float, inclusive: bool,
                 work: tuple[np.ndarray, np.ndarray] | None = None) -> bool:
    """Does HF's top-p keep `token` in this row? One row's `(vocab,)` float32 scores and probabilities.

    HF sorts ascending by score and keeps a token whose running sum of probabilities (float64
    accumulation, rounded to float32) is above `1 - top_p`. The running sum at a token is the mass
    of the lower scores plus its own place among equal scores: of those, the fast path keeps the
    lowest ids (`keep_highest`), so they come last in the ascending order. The mass is summed in
    float32 sums of 16 with a rigorous error bound (as `certified_total`), and exactly in float64
    only when that bound straddles the cut.

    Args:
        scores, probs: `(vocab,)` float32 NumPy arrays (read only).
        token: The token id.
        cut, inclusive: `removal_cut(top_p)` (the row's own, for a per-row top-p).
        work: `(vocab,)` bool and float32 arrays to write into, reused between checks (a fresh
            array of that size costs its page faults every time). Default: new ones.

    >>> cut, inclusive = removal_cut(0.7)
    >>> p = np.array([0.5, 0.2, 0.3], dtype=np.float32)
    >>> [kept_exactly(np.log(p), p, t, cut, inclusive) for t in range(3)]
    [True, False, True]
    """
    score = scores[token]
    lower, below = work if work is not None else (np.empty(scores.shape, bool), np.empty(probs.shape, np.float32))
    np.multiply(probs, np.less(scores, score, out=lower), out=below)  # [V] float32: its probability or 0
    # its tie group's share (int(): NumPy may count in np.int64, which would make every result below NumPy's)
    mine = float(probs[token]) * (1 + int(np.count_nonzero(scores[token + 1 :] == score)))
    width = below.shape[0] // _BLOCK
    approx = float(below[: _BLOCK * width].reshape(_BLOCK, width).sum(axis=0).sum(dtype=np.float64))
    approx += float(below[_BLOCK * width :].sum(dtype=np.float64))
    slack = approx * _SLACK + 1e-30  # 1e-30: room for arithmetic that flushes subnormal terms to zero
    low, high = approx - slack + mine, approx + slack + mine
    if low > cut if inclusive else low >= cut:
        return True
    if not (high > cut if inclusive else high >= cut):
        return False
    running = float(below.sum(dtype=np.float64)) + mine  # the slack straddles the cut: exactly
    return running > cut if inclusive else running >= cut
