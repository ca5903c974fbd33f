"""HF's top-p cut with fixed shapes: among a fixed number of candidates when they provably hold it.

The route `torch.compile` runs (no data-dependent Python control flow, no host-device sync). The
`K` best scores are found from block maxima (`block_topk`), HF's cut among them by `top_p_count`
with the mass of every other token summed in float64, and a device flag says, per row, whether
the cut provably lies among them: the last kept candidate is above every token left out, and the
row has a distribution. When every row's flag is set the candidates give the mask; otherwise the
radix select of `_top_p.py` runs over the whole rows. Compiled, `torch.cond` makes that choice on
the device: both branches are compiled, one runs. In eager mode `torch.cond` would read the flag
on the host, so there the radix select runs alone, as before (`top_p_keep`).

>>> scores = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
>>> top_p_keep(scores, torch.softmax(scores, dim=-1), 0.8, 1, route="candidates").tolist()
[[True, True, False, False]]
"""

from __future__ import annotations

from typing import Literal

import torch

from ._candidates import block_topk, top_p_count
from ._top_p import _CHUNK as _TOP_P_CHUNK
from ._top_p import top_p_mask

__all__ = ["CANDIDATES", "block_topk", "candidate_cut", "top_p_keep"]

_NEG_INF = float("-inf")

CANDIDATES = 512  # candidates per row (the best scores) tried before the radix select

Route = Literal["auto", "cond", "candidates", "radix", "both"]


def top_p_keep(scores: torch.Tensor, probs: torch.Tensor, top_p: float, at_least: int, *,
               route: Route = "auto", k: int = CANDIDATES) -> torch.Tensor:
    """`(batch, vocab)` bool, the tokens HF's `TopPLogitsWarper(top_p, at_least)` keeps; fixed shapes.

    Args:
        scores: `(batch, vocab)` float32 scores, temperature applied.
        probs: `(batch, vocab)` their softmax.
        top_p, at_least: `TopPLogitsWarper`'s `top_p` and `min_tokens_to_keep`.
        route: How the candidates and the radix select are combined. "auto": "cond" while
            `torch.compile` traces, else "radix" (eager `torch.cond` would read the flag on the host).
            "cond": `torch.cond` on the device flag of every row. "candidates": the candidates'
            answer, wrong for rows whose flag is unset (for tests). "radix": the radix select
            alone. "both": both computed, each row takes the one it may (fixed shapes, no branch).
        k: Candidates per row. Default: `CANDIDATES`.

    >>> scores = torch.tensor([[0.0, 1.0, 1.0, 3.0]])
    >>> top_p_keep(scores, torch.softmax(scores, dim=-1), 0.9, 1, route="both").tolist()
    [[False, True, True, True]]
    """
    if route == "auto":
        route = "cond" if torch.compiler.is_compiling() else "radix"
    if route == "radix":
        return _radix(probs, scores, top_p, at_least)
    ids, keep, holds = candidate_cut(scores, probs, top_p, at_least, min(k, scores.shape[-1]))

    def from_candidates(probs: torch.Tensor, scores: torch.Tensor, ids: torch.Tensor,
                        keep: torch.Tensor) -> torch.Tensor:
        # Every write is True (a dropped candidate writes to the row's best instead): a partial last
        # block's padding shares an id with a real token, and duplicate writes must agree.
        return torch.zeros_like(probs, dtype=torch.bool).scatter_(1, torch.where(keep, ids, ids[:, :1]), True)

    def from_radix(probs: torch.Tensor, scores: torch.Tensor, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return _radix(probs, scores, top_p, at_least)

    if ids.shape[-1] == scores.shape[-1] or route == "candidates":  # every token a candidate: always exact
        return from_candidates(probs, scores, ids, keep)
    if route == "both":
        return torch.where(holds, from_candidates(probs, scores, ids, keep), from_radix(probs, scores, ids, keep))
    return torch.cond(holds.all(), from_candidates, from_radix, (probs, scores, ids, keep))


def _radix(probs: torch.Tensor, scores: torch.Tensor, top_p: float, at_least: int) -> torch.Tensor:
    """`top_p_mask` over the whole rows, a chunk of rows at a time as it chunks them itself; the
    chunks are joined as uint8: inductor's CPU code for joining them as bool does not compile
    (torch 2.13: a vectorised int mask meets a float mask)."""
    n, vocab = probs.shape
    rows = max(1, _TOP_P_CHUNK // max(vocab, 1))
    if rows >= n:
        return top_p_mask(probs, top_p, at_least, scores=scores)
    parts = [top_p_mask(probs[start:start + rows], top_p, at_least, scores=scores[start:start + rows])
             for start in range(0, n, rows)]
    return torch.cat([part.to(torch.uint8) for part in parts]).bool()


def candidate_cut(scores: torch.Tensor, probs: torch.Tensor, top_p: float, at_least: int,
                  k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """HF's top-p cut among the `k` best scores of each row, and whether it is provably HF's.

    Returns:
        `(ids, keep, holds)`: `(batch, k)` candidate ids in descending score order (equal scores by
        ascending id), `(batch, k)` bool which of them survive, `(batch, 1)` bool: the row's cut
        lies among its candidates (always when `k` is the vocabulary). A row without a distribution
        (NaN, `+inf`, or only `-inf`: NaN probabilities) keeps every candidate, as HF's comparisons
        with NaN remove nothing, and has `holds` unset unless `k` is the vocabulary.
    """
    vocab = scores.shape[-1]
    cand, ids = block_topk(scores, k)  # [N, K]
    # Equal scores in id order, as `top_candidates` orders them (two sorts of K values, not of V).
    ids, order = ids.sort(dim=-1)
    cand, order = cand.gather(1, order).sort(dim=-1, descending=True, stable=True)
    ids = ids.gather(1, order)
    picked = probs.gather(1, ids)  # [N, K]
    # The mass of the tokens below the candidates, in float64 as HF's cumsum accumulates.
    rest = torch.zeros_like(picked[:, :1], dtype=torch.float64)  # [N, 1]
    if k < vocab:
        total = probs.sum(dim=-1, keepdim=True, dtype=torch.float64)  # [N, 1]
        rest = (total - picked.double().sum(dim=-1, keepdim=True)).clamp_(min=0)
    kept = top_p_count(picked, rest, top_p, at_least)  # [N, 1]
    nan_row = torch.isnan(picked[:, :1])  # [N, 1]: the softmax of a row without a distribution is all NaN
    keep = (torch.arange(k, device=scores.device) < kept) | nan_row  # [N, K]
    if k == vocab:
        return ids, keep, torch.ones_like(nan_row)
    # Certain only if the last kept candidate is above every token that is not a candidate.
    holds = (kept < k) & (cand.gather(1, kept - 1) > cand[:, -1:]) & ~nan_row
    return ids, keep, holds
