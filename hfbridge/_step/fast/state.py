"""The fast path's state between processors: the scores, and what the last filter decided but did
not write yet (`FastState`), so that the draw can skip the writes when nothing reads the scores.

>>> import torch
>>> state = FastState(torch.tensor([[2.0, 1.0, 0.5]]), read_only=True)
>>> state.temperature = 0.5
>>> state.filtered(float("-inf"), keep=torch.tensor([[True, True, False]]))
>>> state.pending, state.current().tolist()
(True, [[4.0, 2.0, -inf]])
"""

from __future__ import annotations

from typing import Any

import torch

from hfbridge._step.fast.draw import draw_checked, draw_kept, draw_one_row_known, pick
from hfbridge._step.fast.top_p.compiled import FixedTopP
from hfbridge._step.fast.top_p.draw import TopPDraw, draw_top_p
from hfbridge._step.fast.top_p.mask import top_p_mask
from hfbridge._step.fast.top_p.sorted_mask import top_p_mask_sorted

__all__ = ["FastState"]

_NEG_INF = float("-inf")


class FastState:
    """The scores between processors, plus what the last filter decided but did not write yet.

    Pending: a `temperature` not yet divided in, and either `keep` (a dense `(batch, vocab)` mask,
    with `probs` the softmax before it when known) or `ids`/`cand`/`cand_keep` (the only tokens
    that can survive: `(batch, K)` ids, their scores and which survive). Deferring the writes lets
    the draw skip them when nothing after the filter reads the scores.
    """

    # Slots: under torch.compile, torch 2.13's dynamo drops the attribute writes made after a
    # `torch.cond` (the fixed-shape top-p's) to an object with a `__dict__` created in the graph.
    __slots__ = ("all_kept", "cand", "cand_keep", "filter_value", "fixed", "ids", "keep", "kept_arrays", "owned",
                 "probs", "scores", "temperature", "top_p")

    def __init__(self, scores: torch.Tensor, *, read_only: bool = False) -> None:
        self.scores = scores  # [N, V] float32
        self.owned = not read_only  # False: the caller's tensor, copied before anything writes to it
        self.probs: torch.Tensor | None = None  # [N, V] softmax(scores), `keep` not applied
        self.keep: torch.Tensor | None = None  # [N, V] bool
        self.ids: torch.Tensor | None = None  # [N, K] int64, distinct per row
        self.cand: torch.Tensor | None = None  # [N, K] float32 scores, sorted descending
        self.cand_keep: torch.Tensor | None = None  # [N, K] bool
        self.all_kept = False  # `cand_keep` is known to be all True (the one-row draw then skips it)
        # the one-row route's kept `(ids, scores)`, `(K,)` NumPy arrays: `ids`/`cand` made only when read
        self.kept_arrays: tuple[Any, Any] | None = None
        self.filter_value = _NEG_INF
        self.temperature: float | None = None  # a division not yet applied to `scores`
        # a top-p cut not found yet, left to the draw (`_top_p_draw.py`), with `probs`
        self.top_p: TopPDraw | None = None
        self.fixed: FixedTopP | None = None  # a top-p cut found on fixed shapes (compiled), not applied yet

    @property
    def pending(self) -> bool:
        """A filter decided but not written into `scores`."""
        return (self.keep is not None or self.ids is not None or self.top_p is not None or self.kept_arrays is not None
                or self.fixed is not None)

    def divided(self) -> torch.Tensor:
        """`scores` with the pending temperature divided in (not the pending filter), to read only.

        A borrowed tensor is divided out of place: one pass that is also the private copy.
        """
        if self.temperature is not None:
            if self.owned:
                self.scores.div_(self.temperature)  # HF: scores / temperature
            else:
                self.scores, self.owned = self.scores / self.temperature, True
            self.temperature = None
        return self.scores

    def current(self) -> torch.Tensor:
        """The scores with everything pending applied, to read only: a pending filter is written
        (into a private tensor), a pending temperature alone is only divided in."""
        if self.pending:
            return self.materialize()
        return self.divided()

    def materialize(self) -> torch.Tensor:
        """Write the pending temperature and filter into `scores` and return them (a private tensor)."""
        n, vocab = self.scores.shape
        self.divided()
        if not self.owned:
            self.scores, self.owned = self.scores.clone(), True
        self._find_top_p_cut()
        if self.kept_arrays is not None:
            ids, cand = self.kept_arrays
            self.ids, self.cand = torch.from_numpy(ids[None]), torch.from_numpy(cand[None])  # [1, K]
            self.cand_keep, self.kept_arrays = torch.ones_like(self.ids, dtype=torch.bool), None
        if self.fixed is not None:
            self.scores, self.fixed = self.fixed.apply(self.filter_value), None
        if self.ids is not None:
            assert self.cand_keep is not None  # set together with `ids`
            self.keep = self.scores.new_zeros((n, vocab), dtype=torch.bool).scatter_(1, self.ids, self.cand_keep)
            self.ids = self.cand = self.cand_keep = None
        if self.keep is not None:
            self.scores.masked_fill_(~self.keep, self.filter_value)
            self.keep = None
        self.probs = None
        return self.scores

    def filtered(self, filter_value: float, *, keep: torch.Tensor | None = None, probs: torch.Tensor | None = None,
                 ids: torch.Tensor | None = None, cand: torch.Tensor | None = None,
                 cand_keep: torch.Tensor | None = None, all_kept: bool = False,
                 kept_arrays: tuple[Any, Any] | None = None, fixed: FixedTopP | None = None) -> None:
        self.filter_value = float(filter_value)
        self.keep, self.probs, self.ids, self.cand, self.cand_keep = keep, probs, ids, cand, cand_keep
        self.all_kept, self.kept_arrays = all_kept, kept_arrays
        self.top_p, self.fixed = None, fixed

    def _find_top_p_cut(self) -> None:
        """Turn a pending top-p into `keep`: the exact cut over the whole row (`_top_p_sorted.py`)."""
        if self.top_p is not None:
            assert self.probs is not None  # set with `top_p`
            top_p, at_least = self.top_p.top_p, self.top_p.at_least
            if self.probs.device.type == "cpu":
                self.keep = top_p_mask_sorted(self.probs, top_p, at_least, scores=self.scores)
            else:
                self.keep = top_p_mask(self.probs, top_p, at_least, scores=self.scores, branch=True)
            self.top_p = None

    def sample(self, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | bool]:
        """`(batch,)` tokens and `(batch,)` bool validity (a Python bool from the one-row CPU draw):
        the softmax of a row with NaN, `+inf` or only `-inf` is all NaN, and the draw flags NaN weights."""
        if self.kept_arrays is not None and self.filter_value == _NEG_INF:
            return draw_kept(*self.kept_arrays, None, generator)  # the one-row route's kept tokens, as they are
        if self.ids is not None and self.filter_value == _NEG_INF:
            assert self.cand is not None and self.cand_keep is not None  # set together with `ids`
            # Unnormalised exp(cand - max): each weight is the same whatever the number of
            # candidates, so the token does not depend on how many were tried (pick's running sum
            # is sequential). NaN for a row whose best is NaN, +inf or -inf: flagged by `pick`.
            if self.ids.shape[0] == 1:  # `ids` come from the CPU candidate routes only
                return draw_one_row_known(self.ids, self.cand, None if self.all_kept else self.cand_keep, generator)
            weights = (self.cand - self.cand[:, :1]).exp_().masked_fill_(~self.cand_keep, 0.0)  # [N, K]
            index, valid = pick(weights, generator)
            return self.ids.gather(1, index[:, None]).squeeze(1), valid
        if self.fixed is not None and self.filter_value == _NEG_INF:
            return self.fixed.draw(generator)  # over the candidates where they hold the cut
        if self.top_p is not None and self.filter_value == _NEG_INF:
            assert self.probs is not None  # set with `top_p`
            tried, top_p, at_least, total = self.top_p
            drawn = draw_top_p(self.scores, self.probs, tried, top_p, at_least, generator, total=total)
            if drawn is not None:
                return drawn
            self._find_top_p_cut()  # no distribution in some row, or min_tokens_to_keep too large
        if self.keep is not None and self.probs is not None and self.filter_value == _NEG_INF:
            # in place: nothing reads `probs` after the draw (the error message uses `scores`)
            return draw_checked(_zero_removed(self.probs, self.keep), generator)
        return draw_checked(torch.softmax(self.materialize(), dim=-1), generator)


def _zero_removed(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """`probs` with 0 where `keep` is False, in place: a multiply by the mask's bytes, which costs
    a fifth of `masked_fill_` on CPU. A removed probability is never NaN or inf, so 0 it is."""
    return probs.mul_(keep.view(torch.uint8))
