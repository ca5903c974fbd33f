"""Smoothing ("quadratic / cubic sampling") as a `transformers.LogitsProcessor`.

Definition (per row): with `d = score - max` (so `d <= 0`), `k = (3 - curve) / 2`, `s = (curve - 1) / 2`,

    score' = -k * factor * d**2 + s * factor * d**3 + max

`-inf` scores stay `-inf`. The best token keeps its score; the others fall away quadratically
(`curve = 1`) or, for `curve > 1`, with a cubic term that keeps the near-best tokens closer. A
small `factor` flattens the distribution near the top, a large one sharpens it.

Reference: kalomaze's quadratic sampling, text-generation-webui `modules/sampler_hijack.py`
(`QuadraticSamplingLogitsWarper`, options `smoothing_factor`, `smoothing_curve`; also in
koboldcpp). llama.cpp has no smoothing sampler. text-generation-webui takes `max` over the whole
batch (one value for every row); here it is each row's own maximum, so rows do not affect each
other. `factor >= 0` (0 = off), `curve >= 1` (below 1 the cubic term would lift the worst
tokens above the best). Defaults: `smoothing_factor = 0` (off), `smoothing_curve = 1.0`.

Batched and sync-free: a few elementwise passes per row.

>>> import torch
>>> SmoothingLogitsWarper(0.5)(None, torch.tensor([[0.0, -1.0, -2.0, -float("inf")]]))
tensor([[ 0.0000, -0.5000, -2.0000,    -inf]])
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor

from hfbridge.processors._cpu_side import fused_path, scores_owned, scratch
from hfbridge.processors._rows import RowParam

__all__ = ["SmoothingLogitsWarper"]


class SmoothingLogitsWarper(LogitsProcessor):
    """Quadratic (and cubic) smoothing of the scores around the row's best (see the module).

    Args:
        factor: The smoothing factor (>= 0; 0 leaves the scores unchanged). One value, or one per row.
        curve: 1 is quadratic; above 1 adds the cubic term (>= 1). Default: 1.0. One value, or one per row.
    """

    keeps_ids_intact = True  # traits (`hfbridge.processors._traits`): keeps no ids
    reads_ids = False  # nor reads them: an engine may skip building the histories

    def __init__(self, factor: Any, curve: Any = 1.0):
        self.factor = RowParam("factor", factor, minimum=0.0)
        self.curve = RowParam("curve", curve, minimum=1.0)

    def __call__(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        rows = scores.shape[0]  # [B, V]
        if self.factor.all(lambda f: f == 0.0):
            return scores
        device, dtype = scores.device, scores.dtype
        factor = self.factor.tensor(rows, device, dtype)[:, None]  # [B, 1]
        curve = self.curve.tensor(rows, device, dtype)[:, None]
        best = scores.amax(-1, keepdim=True).clamp(min=torch.finfo(dtype).min)  # [B, 1]; a row of -inf stays
        curves = self.curve.for_rows(rows)
        # owned scores (hfbridge's own float32 copy) take the result, unless the original is read below
        inplace = scores_owned() and not scores.requires_grad and not self.factor.any(lambda f: f == 0.0) and (
            all(c == 1.0 for c in curves) or not any(c == 1.0 for c in curves))
        d = torch.sub(scores, best, out=scores) if inplace else scores - best  # [B, V], <= 0; -inf stays -inf
        if all(c == 1.0 for c in curves):
            # -k f d^2 with k = 1: the cubic term is 0; d = -inf gives -inf by itself (f > 0)
            smoothed = d.square_().mul_(-factor).add_(best)
        else:
            quadratic = (3 - curve) / 2 * factor  # [B, 1]
            cubic = (curve - 1) / 2 * factor
            # -k f d^2 + s f d^3 = d^2 (s f d - k f); d = -inf gives -inf when s > 0 (curve > 1): two fused
            # multiply-adds, the first into a scratch buffer on the host path
            if scores.requires_grad:  # out= refuses a graph
                smoothed = (d * cubic - quadratic).mul_(d.square_()).add_(best)
            else:
                slope = scratch(scores) if fused_path(scores) else torch.empty_like(d)
                torch.addcmul(-quadratic, d, cubic, out=slope)  # [B, V] s f d - k f
                smoothed = torch.addcmul(best, d.square_(), slope, out=d)  # d^2 (s f d - k f) + best
            if any(c == 1.0 for c in curves):  # rows with s = 0 turn -inf into NaN (0 * inf)
                smoothed = torch.where(scores == -torch.inf, scores, smoothed)
        if self.factor.any(lambda f: f == 0.0):  # factor 0 is off (every score would become the best)
            smoothed = torch.where(factor == 0, scores, smoothed)
        return smoothed

    def __repr__(self) -> str:
        return f"{type(self).__name__}(factor={self.factor}, curve={self.curve})"
