"""HF's top-p cut with fixed shapes: among a fixed number of candidates when they provably hold it.

The route `torch.compile` runs (no data-dependent Python control flow, no host-device sync).
`fixed_top_p` finds the `K` best scores in HF's order (`_step/fast/ordered_topk.py`: block maxima, then one
`torch.topk` of int64 keys), HF's cut among them with the mass of every other token bounded in
float64, and a device flag per row: the cut provably lies among them (the count is the same at
both ends of the bound, the last kept candidate is above every token left out, and the row has a
distribution). Nothing of the size of the vocabulary is written but the scores. Its `draw` then
picks a token among the kept candidates when every row's flag is set, and otherwise runs the radix
select of `_step/fast/top_p/mask.py` over the whole rows and draws from the masked softmax; its `apply` writes the
filtered scores the same way. Compiled, `torch.cond` makes that choice: both branches are
compiled, one runs. `candidate_cut` and `top_p_keep` are the same cut from given probabilities
with the exact float64 total (tests, and eager fixed shapes: there `torch.cond` would read the
flag on the host, so the radix select runs alone).

>>> scores = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
>>> top_p_keep(scores, torch.softmax(scores, dim=-1), 0.8, 1, route="candidates").tolist()
[[True, True, False, False]]
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from hfbridge._step.fast.candidates import block_topk, top_p_count
from hfbridge._step.fast.ordered_topk import ordered_topk
from hfbridge._step.fast.top_p.mask import _CHUNK as _TOP_P_CHUNK
from hfbridge._step.fast.top_p.mask import TopP, removal_cut, survives, top_p_mask, top_p_rows
from hfbridge._step.fast.weighted_draw import draw_checked, pick

__all__ = ["CANDIDATES", "FixedTopP", "block_topk", "candidate_cut", "fixed_top_p", "top_p_keep"]

_NEG_INF = float("-inf")

CANDIDATES = 512  # candidates per row (the best scores) tried before the radix select

Route = Literal["auto", "cond", "candidates", "radix", "both"]


def top_p_keep(scores: torch.Tensor, probs: torch.Tensor, top_p: TopP, at_least: int, *,
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


def _radix(probs: torch.Tensor, scores: torch.Tensor, top_p: TopP, at_least: int) -> torch.Tensor:
    """`top_p_mask` over the whole rows, a chunk of rows at a time as it chunks them itself; the
    chunks are joined as uint8: inductor's CPU code for joining them as bool does not compile
    (torch 2.13: a vectorised int mask meets a float mask)."""
    n, vocab = probs.shape
    rows = max(1, _TOP_P_CHUNK // max(vocab, 1))
    if rows >= n:
        return top_p_mask(probs, top_p, at_least, scores=scores)
    parts = [top_p_mask(probs[start:start + rows], top_p_rows(top_p, slice(start, start + rows)), at_least,
                        scores=scores[start:start + rows]) for start in range(0, n, rows)]
    return torch.cat([part.to(torch.uint8) for part in parts]).bool()


def candidate_cut(scores: torch.Tensor, probs: torch.Tensor, top_p: TopP, at_least: int,
                  k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """HF's top-p cut among the `k` best scores of each row, and whether it is provably HF's.

    Returns:
        `(ids, keep, holds)`: `(batch, k)` candidate ids in descending score order (equal scores by
        ascending id), `(batch, k)` bool which of them survive, `(batch, 1)` bool: the row's cut
        lies among its candidates (always when `k` is the vocabulary). A row without a distribution
        (NaN, `+inf`, or only `-inf`: NaN probabilities) keeps every candidate, as HF's comparisons
        with NaN remove nothing, and has `holds` unset unless `k` is the vocabulary.
    """
    ids, _, keep, holds = _cut(scores, probs, top_p, at_least, k)
    return ids, keep, holds


def _cut(scores: torch.Tensor, probs: torch.Tensor, top_p: TopP, at_least: int,
         k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`candidate_cut`, with the candidates' scores: `(ids, cand, keep, holds)`."""
    vocab = scores.shape[-1]
    cand, ids, _ = ordered_topk(scores, k)  # [N, K], equal scores in id order as `top_candidates` orders them
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
        return ids, cand, keep, torch.ones_like(nan_row)
    # Certain only if the last kept candidate is above every token that is not a candidate.
    holds = (kept < k) & (cand.gather(1, kept - 1) > cand[:, -1:]) & ~nan_row
    return ids, cand, keep, holds


class FixedTopP(NamedTuple):
    """HF's top-p cut found on fixed shapes but not yet applied (`fixed_top_p`); `draw` and `apply`
    each choose with `torch.cond` between the candidates and the radix select over the rows."""

    scores: torch.Tensor  # [N, V] float32, temperature applied
    ids: torch.Tensor  # [N, K] int64 candidates, best first
    cand: torch.Tensor  # [N, K] float32 their scores
    keep: torch.Tensor  # [N, K] bool which of them survive
    holds: torch.Tensor  # [N, 1] bool the row's cut lies among its candidates
    top_p: TopP  # one, or `(batch, 1)` float64: one per row
    at_least: int

    def draw(self, generator: torch.Generator | None = None, *, route: Route = "cond"
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(batch,)` tokens from HF's top-p distribution and `(batch,)` bool validity.

        Where every row's cut lies among its candidates, the draw looks at the candidates only:
        `pick` over `exp(cand - best)` where kept, the candidate route's own draw (so the same
        uniform numbers give the same tokens). Otherwise the whole rows: the radix select's mask on
        the softmax, then `draw_checked`. The two uniform numbers per row are drawn before the
        choice (nothing is drawn inside `torch.cond`), in the order `draw_checked` draws them.

        Args:
            generator: Seeds the draw. Default: torch's global generator (under `torch.compile`).
            route: "cond" (`torch.cond` on the flags of every row), "both" (both draws, each row
                takes the one it may: for tests, no host read in eager mode) or "candidates" (the
                candidates' draw, wrong for rows whose flag is unset: for tests).
        """
        shape = (self.scores.shape[0], 1)
        uniforms = tuple(torch.rand(shape, generator=generator, device=self.scores.device, dtype=torch.float64)
                         for _ in range(2))  # [N, 1] each
        top_p, at_least = self.top_p, self.at_least

        def from_candidates(scores: torch.Tensor, ids: torch.Tensor, cand: torch.Tensor, keep: torch.Tensor,
                            first: torch.Tensor, second: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            weights = (cand - cand[:, :1]).exp().masked_fill(~keep, 0.0)  # [N, K]
            index, valid = pick(weights, uniform=first)
            return ids.gather(1, index[:, None]).squeeze(1), valid

        def from_rows(scores: torch.Tensor, ids: torch.Tensor, cand: torch.Tensor, keep: torch.Tensor,
                      first: torch.Tensor, second: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            probs = torch.softmax(scores, dim=-1)  # [N, V]
            mask = _radix(probs, scores, top_p, at_least)
            return draw_checked(probs.mul_(mask.view(torch.uint8)), uniforms=(first, second))

        operands = (self.scores, self.ids, self.cand, self.keep, *uniforms)
        if self.ids.shape[-1] == self.scores.shape[-1] or route == "candidates":  # all candidates: exact
            return from_candidates(*operands)
        if route == "both":
            tokens, valid = from_candidates(*operands)
            rows = from_rows(*operands)
            holds = self.holds[:, 0]
            return torch.where(holds, tokens, rows[0]), torch.where(holds, valid, rows[1])
        tokens, valid = torch.cond(self.holds.all(), from_candidates, from_rows, operands)
        return tokens, valid

    def apply(self, filter_value: float, *, route: Route = "cond") -> torch.Tensor:
        """`(batch, vocab)` the scores with `filter_value` where HF's top-p removes a token (new tensor).

        Written as floats, never as a `(batch, vocab)` bool mask: inductor's CPU code stores bools
        one at a time (torch 2.13), tens of times slower than floats. `route`: as in `draw`.
        """
        top_p, at_least = self.top_p, self.at_least

        def from_candidates(scores: torch.Tensor, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            # A dropped candidate writes the row's best instead (kept: the flag is set): a partial
            # last block's padding shares an id with a real token, and duplicate writes must agree.
            ids = torch.where(keep, ids, ids[:, :1])
            return torch.full_like(scores, filter_value).scatter_(1, ids, scores.gather(1, ids))

        def from_rows(scores: torch.Tensor, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            mask = _radix(torch.softmax(scores, dim=-1), scores, top_p, at_least)
            return scores.masked_fill(~mask, filter_value)

        operands = (self.scores, self.ids, self.keep)
        if self.ids.shape[-1] == self.scores.shape[-1]:
            return from_candidates(*operands)
        if route == "both":
            return torch.where(self.holds, from_candidates(*operands), from_rows(*operands))
        return torch.cond(self.holds.all(), from_candidates, from_rows, operands)


def fixed_top_p(scores: torch.Tensor, top_p: TopP, at_least: int, k: int = CANDIDATES) -> FixedTopP:
    """HF's top-p cut among `k` candidates per row, with each row's flag: whether they hold it.

    `candidate_cut` in two reads of the row (the block maxima, then one pass for the softmax's
    sums), where the exact float64 total of the probabilities would take two more: the total is
    taken from the float64 sum of the softmax's exponentials, which bounds it within a relative
    `2**-22` (each probability `fl(e / z)` is within `2**-24` of `e / z`), and a row whose count
    differs at the two ends of that interval is not proven (its flag is unset: the radix select
    answers for it, exactly). The candidates' probabilities are the softmax's own arithmetic,
    `exp(x - max) / sum`: no `(batch, vocab)` tensor of probabilities is written.

    Args:
        scores: `(batch, vocab)` float32 scores, temperature applied.
        top_p, at_least: `TopPLogitsWarper`'s `top_p` and `min_tokens_to_keep`.
        k: Candidates per row. Default: `CANDIDATES`.

    >>> scores = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    >>> cut = fixed_top_p(scores, 0.8, 1)
    >>> cut.apply(float("-inf")).tolist()
    [[2.0, 1.0, -inf, -inf]]
    >>> cut.draw(torch.Generator().manual_seed(0))[0].tolist()
    [1]
    """
    vocab = scores.shape[-1]
    k = min(k, vocab)
    cand, ids, best = ordered_topk(scores, k)  # [N, K] best first, equal scores in id order; [N, 1]
    exps = (scores - best).exp()  # [N, V], never written: both sums read it in one pass
    norm = exps.sum(dim=-1, keepdim=True)  # [N, 1] float32, the softmax's denominator
    picked = (cand - best).exp() / norm  # [N, K] the softmax at the candidates
    nan_row = torch.isnan(picked[:, :1])  # [N, 1]: NaN, +inf, or only -inf in the row
    if k == vocab:
        kept = top_p_count(picked, torch.zeros_like(norm, dtype=torch.float64), top_p, at_least)
        holds = torch.ones_like(nan_row)
    else:
        total = exps.sum(dim=-1, keepdim=True, dtype=torch.float64) / norm.double()  # [N, 1]
        slack = total * _TOTAL_SLACK + 1e-30  # 1e-30: probabilities rounded to subnormals
        # `top_p_count` at both ends of the interval, its running sums computed once
        tail = picked.double().flip(-1).cumsum(dim=-1).flip(-1)  # [N, K] mass at or below each candidate
        mass = tail[:, :1]  # [N, 1] the candidates' mass
        cut, inclusive = removal_cut(top_p)

        def count(rest: torch.Tensor) -> torch.Tensor:
            cumulative = tail + rest.clamp_(min=0)
            kept = survives(cumulative, cut, inclusive).sum(dim=-1, keepdim=True)
            return kept.clamp_(min=min(at_least, k))

        kept, high = count(total - slack - mass), count(total + slack - mass)  # [N, 1] each
        # Certain only if the count is and the last kept candidate is above every token left out.
        holds = (kept == high) & (kept < k) & (cand.gather(1, kept - 1) > cand[:, -1:]) & ~nan_row
    keep = (torch.arange(k, device=scores.device) < kept) | nan_row  # [N, K]
    return FixedTopP(scores, ids, cand, keep, holds, top_p, at_least)


_TOTAL_SLACK = 2.0**-22  # relative bound of the total in `fixed_top_p`: 2**-24 proven, room for one ulp of exp
