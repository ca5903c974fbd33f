"""What the fast path's last filter decided but has not written into the scores: one tagged value.

A filter leaves one of these on the `FastState` (`state.py`) instead of writing `filter_value` over
the tokens it removes, so that a draw right after it can skip the writes. Each value knows the two
ways out: `write` (the scores HF's filter returns) and `draw` (one token per row without writing;
None: write first, then draw from the softmax).

| value | left by | holds |
| --- | --- | --- |
| `Mask` | min-p, top-k without candidates, top-p's exact and radix cuts | `(batch, vocab)` kept, the softmax |
| `Candidates` | top-k and top-p when the best tokens hold every cut | `(batch, K)` ids, scores, which survive |
| `OneRow` | one CPU row: top-k, top-p (`one_row.py`); top-p, min-p after them | `(K,)` NumPy ids, scores; kept |
| `Draw` | top-p keeping many tokens, CPU (`top_p/draw_then_check.py`) | the cut left to the draw's check |
| `Fixed` | top-p under `torch.compile` (`top_p/compiled.py`) | the fixed-shape cut |

The top-p route table that chooses among them is `top_p/route_table.py`.

>>> import torch
>>> pending = Mask(torch.tensor([[True, False, True]]))
>>> pending.write(torch.tensor([[1.0, 2.0, 3.0]]), float("-inf"))
tensor([[1., -inf, 3.]])
>>> Candidates(torch.tensor([[2, 0]]), torch.tensor([[3.0, 1.0]]), torch.tensor([[True, False]])).write(
...     torch.tensor([[1.0, 2.0, 3.0]]), float("-inf"))
tensor([[-inf, -inf, 3.]])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from hfbridge._step.fast.top_p.compiled import FixedTopP
from hfbridge._step.fast.top_p.draw_then_check import TopPDraw, draw_top_p
from hfbridge._step.fast.top_p.sorted_mask import exact_top_p_mask
from hfbridge._step.fast.weighted_draw import draw_checked, draw_kept, draw_one_row_known, pick

__all__ = ["Candidates", "Draw", "Fixed", "Mask", "OneRow", "Pending"]

Drawn = tuple[torch.Tensor, Any]  # (batch,) tokens and (batch,) bool validity, or one row's Python bool


class Mask(NamedTuple):
    """A dense decision: `keep` `(batch, vocab)` bool; `probs` the softmax before it, when known."""

    keep: torch.Tensor  # [N, V] bool
    probs: torch.Tensor | None = None  # [N, V] float32

    def write(self, scores: torch.Tensor, filter_value: float) -> torch.Tensor:
        return scores.masked_fill_(~self.keep, filter_value)  # scores: [N, V], the state's own

    def draw(self, scores: torch.Tensor, generator: torch.Generator | None) -> Drawn | None:
        if self.probs is None:
            return None
        # in place: nothing reads `probs` after the draw (an error message reads the scores)
        return draw_checked(_zero_removed(self.probs, self.keep), generator)


class Candidates(NamedTuple):
    """The only tokens that can survive: `(batch, K)` ids, their scores (descending), which survive."""

    ids: torch.Tensor  # [N, K] int64, distinct per row
    cand: torch.Tensor  # [N, K] float32
    keep: torch.Tensor  # [N, K] bool
    all_kept: bool = False  # `keep` is known to be all True (the one-row draw then skips it)

    def write(self, scores: torch.Tensor, filter_value: float) -> torch.Tensor:
        n, vocab = scores.shape
        keep = scores.new_zeros((n, vocab), dtype=torch.bool).scatter_(1, self.ids, self.keep)  # [N, V]
        return scores.masked_fill_(~keep, filter_value)

    def draw(self, scores: torch.Tensor, generator: torch.Generator | None) -> Drawn:
        # Unnormalised exp(cand - max): each weight is the same whatever the number of candidates,
        # so the token does not depend on how many were tried (pick's running sum is sequential).
        # NaN for a row whose best is NaN, +inf or -inf: flagged by `pick`.
        if self.ids.shape[0] == 1:  # `ids` come from the CPU candidate routes only
            return draw_one_row_known(self.ids, self.cand, None if self.all_kept else self.keep, generator)
        # removed weights 0 by a multiply with the mask's bytes (a twentieth of `masked_fill_`'s cost on CPU):
        # every weight is in [0, 1] or NaN, and a NaN weight is the first, kept, so the same values
        weights = (self.cand - self.cand[:, :1]).exp_().mul_(self.keep.view(torch.uint8))  # [N, K]
        index, valid = pick(weights, generator)
        return self.ids.gather(1, index[:, None]).squeeze(1), valid


class OneRow(NamedTuple):
    """A one-row CPU filter's tokens as `(K,)` NumPy arrays, best first (equal scores by id): the one-row
    top-p's kept tokens, or a top-k's candidates; the first `kept` survive (None: all). Tensors are
    made only if something reads the scores."""

    ids: np.ndarray  # [K] int64
    cand: np.ndarray  # [K] float32
    kept: int | None = None

    def write(self, scores: torch.Tensor, filter_value: float) -> torch.Tensor:
        ids, cand = torch.from_numpy(self.ids[None, : self.kept]), torch.from_numpy(self.cand[None, : self.kept])
        return Candidates(ids, cand, torch.ones_like(ids, dtype=torch.bool)).write(scores, filter_value)  # [1, kept]

    def draw(self, scores: torch.Tensor, generator: torch.Generator | None) -> Drawn:
        # the weights of all K candidates, the removed ones 0: the same token as the batched `Candidates`
        return draw_kept(self.ids, self.cand, self.kept, generator)


class Draw(NamedTuple):
    """A top-p cut not found: the draw checks its tokens (`draw_top_p`); `probs` `(batch, vocab)`."""

    plan: TopPDraw
    probs: torch.Tensor  # [N, V] float32, softmax of the scores

    def mask(self, scores: torch.Tensor) -> Mask:
        """The cut found over the whole rows, for whatever reads the scores."""
        return Mask(exact_top_p_mask(self.probs, self.plan.top_p, self.plan.at_least, scores=scores), self.probs)

    def write(self, scores: torch.Tensor, filter_value: float) -> torch.Tensor:
        return self.mask(scores).write(scores, filter_value)

    def draw(self, scores: torch.Tensor, generator: torch.Generator | None) -> Drawn | None:
        tried, top_p, at_least, total = self.plan
        drawn = draw_top_p(scores, self.probs, tried, top_p, at_least, generator, total=total)
        if drawn is not None:
            return drawn
        # out of place: a later `write` finds the cut from `probs` again
        return draw_checked(self.probs.mul(self.mask(scores).keep.view(torch.uint8)), generator)


class Fixed(NamedTuple):
    """A top-p cut found on fixed shapes (compiled), not applied yet."""

    fixed: FixedTopP

    def write(self, scores: torch.Tensor, filter_value: float) -> torch.Tensor:
        return self.fixed.apply(filter_value)

    def draw(self, scores: torch.Tensor, generator: torch.Generator | None) -> Drawn:
        return self.fixed.draw(generator)  # over the candidates where they hold the cut


Pending = Mask | Candidates | OneRow | Draw | Fixed  # a filter's decision, not written yet


def _zero_removed(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """`probs` with 0 where `keep` is False, in place: a multiply by the mask's bytes, which costs
    a fifth of `masked_fill_` on CPU. A removed probability is never NaN or inf, so 0 it is."""
    return probs.mul_(keep.view(torch.uint8))
