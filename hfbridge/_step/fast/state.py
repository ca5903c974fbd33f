"""The fast path's state between processors: the scores, and what the last filter decided but did
not write yet (one tagged value, `pending.py`), so that the draw can skip the writes when nothing
reads the scores.

>>> import torch
>>> from hfbridge._step.fast.pending import Mask
>>> state = FastState(torch.tensor([[2.0, 1.0, 0.5]]), read_only=True)
>>> state.temperature = 0.5
>>> state.filtered(float("-inf"), Mask(torch.tensor([[True, True, False]])))
>>> type(state.pending).__name__, state.current().tolist()
('Mask', [[4.0, 2.0, -inf]])
"""

from __future__ import annotations

import torch

from hfbridge._step.fast.pending import Drawn, Pending
from hfbridge._step.fast.weighted_draw import draw_checked
from hfbridge._step.fast.workspace import lend_like

__all__ = ["FastState"]

_NEG_INF = float("-inf")


class FastState:
    """The scores between processors, plus what the last filter decided but did not write yet.

    Pending: a `temperature` not yet divided in, and one `Pending` value (a dense mask, candidates,
    the one-row route's kept tokens, a top-p cut left to the draw, or the compiled cut) with the
    `filter_value` it writes. Deferring the writes lets the draw skip them when nothing after the
    filter reads the scores.
    """

    # Slots: under torch.compile, torch 2.13's dynamo drops the attribute writes made after a
    # `torch.cond` (the fixed-shape top-p's) to an object with a `__dict__` created in the graph.
    __slots__ = ("__weakref__", "filter_value", "lent", "memo", "owned", "pending", "scores", "temperature")

    def __init__(self, scores: torch.Tensor, *, read_only: bool = False, memo: dict | None = None) -> None:
        self.scores = scores  # [N, V] float32
        self.owned = not read_only  # False: the caller's tensor, copied before anything writes to it
        # the Sampler's memo on CPU eager (None elsewhere): buffers lent from step to step (`workspace.py`)
        self.memo = memo
        self.lent = False  # `scores` is such a buffer: never handed to a processor or a caller (`private`)
        self.pending: Pending | None = None  # a filter decided but not written into `scores`
        self.filter_value = _NEG_INF  # what `pending` writes over the tokens it removes
        # a division not yet applied to `scores`: HF's float, or `(rows, 1)` float32 (per-row values)
        self.temperature: float | torch.Tensor | None = None

    def divided(self) -> torch.Tensor:
        """`scores` with the pending temperature divided in (not the pending filter), to read only.

        A borrowed tensor is divided out of place: one pass that is also the private copy.
        """
        temperature = self.temperature
        if temperature is not None:
            if isinstance(temperature, torch.Tensor) and self.scores.device.type == "cuda":
                # (rows, 1) temperatures: HF divides by a Python float, which torch on CUDA runs as a
                # multiplication by its float32 reciprocal (IEEE division on host and device alike)
                factor = torch.reciprocal(temperature)  # [N, 1]
                if self.owned:
                    self.scores.mul_(factor)
                else:
                    self.scores, self.owned = self.scores * factor, True
            elif self.owned:
                self.scores.div_(temperature)  # HF: scores / temperature
            elif (out := self._lent("scores")) is not None:  # the same division, into a buffer kept between steps
                self.scores, self.owned, self.lent = torch.div(self.scores, temperature, out=out), True, True
            else:
                self.scores, self.owned = self.scores / temperature, True
            self.temperature = None
        return self.scores

    def softmax(self) -> torch.Tensor:
        """`softmax(current())` `(N, V)`, on CPU eager into a lent buffer: for the step's own use only."""
        scores = self.current()
        out = self._lent("probs")
        return torch.softmax(scores, dim=-1) if out is None else torch.softmax(scores, dim=-1, out=out)

    def _lent(self, key: str) -> torch.Tensor | None:
        """A buffer shaped as the scores, lent from step to step (`workspace.py`), or None: compute out of place."""
        return None if self.memo is None else lend_like(self.scores, self, self.memo, key)

    def private(self) -> torch.Tensor:
        """`materialize`, in a tensor that is the caller's to keep: what a processor or a caller receives (a
        lent buffer is written again at a later step)."""
        scores = self.materialize()
        if self.lent:
            self.scores, self.lent = scores.clone(), False
        return self.scores

    def current(self) -> torch.Tensor:
        """The scores with everything pending applied, to read only: a pending filter is written
        (into a private tensor), a pending temperature alone is only divided in."""
        if self.pending is not None:
            return self.materialize()
        return self.divided()

    def materialize(self) -> torch.Tensor:
        """Write the pending temperature and filter into `scores` and return them (a private tensor)."""
        self.divided()
        if not self.owned:
            self.scores, self.owned = self.scores.clone(), True
        if self.pending is not None:
            self.scores, self.pending = self.pending.write(self.scores, self.filter_value), None
        return self.scores

    def peek(self) -> torch.Tensor:
        """A copy of the scores with everything pending applied, the state left as it is: what a recorder
        (`fast_draw(record=...)`) reads, so that recording never changes the draw."""
        scores, temperature = self.scores, self.temperature
        if temperature is None:
            scores = scores.clone()
        elif isinstance(temperature, torch.Tensor) and scores.device.type == "cuda":
            scores = scores * torch.reciprocal(temperature)  # as `divided`
        else:
            scores = scores / temperature
        return scores if self.pending is None else self.pending.write(scores, self.filter_value)  # [N, V]

    def filtered(self, filter_value: float, pending: Pending) -> None:
        """A filter's decision, left pending until something reads the scores or draws."""
        self.filter_value = float(filter_value)
        self.pending = pending

    def sample(self, generator: torch.Generator | None) -> Drawn:
        """`(batch,)` tokens and `(batch,)` bool validity (a Python bool from the one-row CPU draw):
        the softmax of a row with NaN, `+inf` or only `-inf` is all NaN, and the draw flags NaN weights."""
        if self.pending is not None and self.filter_value == _NEG_INF:  # a removed token has weight 0
            drawn = self.pending.draw(self.scores, generator)
            if drawn is not None:
                return drawn
        return draw_checked(self.softmax(), generator)
