"""Dynamic temperature (entropy-scaled), as a `transformers.LogitsProcessor` that replaces temperature.

Definition (per row), llama.cpp's `temp_ext`:

    T = T_min + (T_max - T_min) * (H / log n) ** exponent,   T_min = max(0, temperature - range),
                                                              T_max = temperature + range

with `H` the entropy (nats) of the row's softmax and `n` its number of candidates (finite scores);
the scores are divided by `T`. A confident row (low entropy) gets a temperature near `T_min`, a
flat one near `T_max`. A row with at most one candidate is left unchanged; a row whose `T` comes out
`<= 0` keeps only its best token (llama.cpp's greedy temperature: the first best id).

Reference: llama.cpp `src/llama-sampler.cpp`, `llama_sampler_temp_ext_apply`; `common/common.h`:
`dynatemp_range = 0.0` (off), `dynatemp_exponent = 1.0`. The method comes from kalomaze's
"DynaTemp" (koboldcpp / text-generation-webui); text-generation-webui takes `dynatemp_low` /
`dynatemp_high` instead of a centre and a range, and normalises by `log` of the whole vocabulary.
hfbridge uses it in place of `temperature` when `dynatemp_range > 0`.

Batched and sync-free: softmax, entropy and the division, all per row on the device; on CPU a host path
takes the entropy from one fused softmax (docs/samplers.md, "Cost").

>>> import torch
>>> scores = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).log()
>>> DynamicTemperatureLogitsWarper(1.0, 0.0)(None, scores).softmax(-1)
tensor([[0.1000, 0.2000, 0.3000, 0.4000]])
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import LogitsProcessor

from hfbridge.processors._cpu_side import fused_path, scores_owned, scratch
from hfbridge.processors._rows import RowParam, finite_count

__all__ = ["DynamicTemperatureLogitsWarper"]


class DynamicTemperatureLogitsWarper(LogitsProcessor):
    """Divide each row by a temperature chosen from its entropy (see the module).

    Args:
        temperature: The centre of the range (>= 0). One value, or one per row.
        range: Half the width of the range (>= 0; 0 is plain temperature). One value, or one per row.
        exponent: Shapes the curve from entropy to temperature (> 0). Default: 1.0.
    """

    keeps_ids_intact = True  # traits (`hfbridge.processors._traits`): keeps no ids
    reads_ids = False  # nor reads them: an engine may skip building the histories
    sampler_name = "temperature"

    def __init__(self, temperature: Any, range: Any, exponent: Any = 1.0):
        self.temperature = RowParam("temperature", temperature, minimum=0.0)
        self.range = RowParam("range", range, minimum=0.0)
        self.exponent = RowParam("exponent", exponent, above=0.0)

    def __call__(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        rows = scores.shape[0]  # [B, V]
        device, dtype = scores.device, scores.dtype
        positive = self.temperature.all(lambda t: t > 0) and all(
            t - r > 0 for t, r in zip(self.temperature.for_rows(rows), self.range.for_rows(rows)))
        if positive and scores.shape[1] > 1 and fused_path(scores):
            out = self._on_host(scores)
            if out is not None:
                return out
        centre = self.temperature.tensor(rows, device, dtype)[:, None]  # [B, 1]
        spread = self.range.tensor(rows, device, dtype)[:, None]
        low, high = (centre - spread).clamp(min=0), centre + spread
        best = scores.amax(-1, keepdim=True).clamp(min=torch.finfo(dtype).min)  # [B, 1]; a row of -inf stays
        shifted = scores - best  # [B, V] <= 0, -inf stays -inf
        candidates = finite_count(shifted)  # [B, 1] float
        weights = shifted.exp()  # [B, V] unnormalised p; 0 for -inf
        total = weights.sum(-1, keepdim=True)
        # H = -sum p log p = log Z - sum(w * shifted) / Z, with -inf (weight 0) counted as 0
        entropy = total.log() - torch.linalg.vecdot(weights, shifted.nan_to_num_(neginf=0.0))[:, None] / total
        normalised = entropy / (1.0 / candidates.clamp(min=2)).log().neg()  # llama.cpp: -log(1/n)
        dynamic = low + (high - low) * normalised.pow(self.exponent.tensor(rows, device, dtype)[:, None])
        # `range == 0` is plain temperature, as llama.cpp's temp_ext falls back to it; a row with at
        # most one candidate is left as it is (temperature 1)
        temperature = torch.where(spread > 0, dynamic, centre).masked_fill(candidates <= 1, 1.0)  # [B, 1]
        divided = scores / temperature.clamp(min=torch.finfo(dtype).tiny)
        if positive:
            return divided  # T >= T_min > 0 in every row: no greedy row possible (known on the host)
        # T <= 0: llama.cpp's greedy temperature keeps the first best token only
        others = torch.ones_like(scores, dtype=torch.bool).scatter_(1, scores.argmax(-1, keepdim=True), False)
        return torch.where(temperature > 0, divided, scores.masked_fill(others, -torch.inf))

    def _on_host(self, scores: torch.Tensor) -> torch.Tensor | None:
        """Every row's best finite (None otherwise), every temperature > 0: the entropy from one softmax.

        With `p = softmax(scores)`, `Z = sum(exp(scores - best))` and `max(p) = 1 / Z`:
        `H = log Z - sum(p * (scores - best)) = best - log(max p) - sum(p * scores)`, so one softmax
        (torch's fused kernel), two maxima and a dot product per row replace the shifted copy, the
        exponentials and the count of the general path; the temperature per row from those numbers
        on the host (in float64: a few small ops fewer, which is most of the cost at B=1). A row with
        scores at -inf (p = 0 there) takes its dot product over its finite scores only (in order) and
        counts them, so a row equals itself with -inf columns appended, bit for bit. The softmax's
        exponentials are torch's fast ones (a few float32 ulps); `tests/processors/test_samplers_fused.py`
        bounds the difference.
        """
        rows, vocab = scores.shape  # [B, V]
        best = scores.amax(-1).tolist()  # host reads: free on CPU
        if not all(math.isfinite(b) for b in best):  # NaN, +inf or nothing left: the general path
            return None
        probs = torch.softmax(scores, -1, out=scratch(scores))  # [B, V]
        top = probs.amax(-1).tolist()  # 1 / Z per row
        temperatures = []
        for row, (b, t, centre, spread, exponent) in enumerate(zip(
                best, top, self.temperature.for_rows(rows), self.range.for_rows(rows), self.exponent.for_rows(rows))):
            mean, count = float(torch.dot(probs[row], scores[row])), vocab
            if not math.isfinite(mean):  # 0 * -inf: scores removed before; they add nothing and are no candidates
                finite = scores[row] > -torch.inf  # [V]
                kept = scores[row][finite]  # [n] in order: the same dot product as the row without them
                mean, count = float(torch.dot(probs[row][finite], kept)), kept.numel()
            if count <= 1:
                temperatures.append(1.0)  # at most one candidate: left as it is
            elif spread > 0:
                low, high = max(centre - spread, 0.0), centre + spread
                normalised = max(b - math.log(t) - mean, 0.0) / math.log(count)  # H >= 0
                temperatures.append(low + (high - low) * normalised**exponent)
            else:
                temperatures.append(centre)
        temperature = torch.tensor(temperatures, dtype=scores.dtype)[:, None]  # [B, 1] (a row alone divides alike)
        return scores.div_(temperature) if scores_owned() else scores / temperature

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(temperature={self.temperature}, range={self.range}, "
                f"exponent={self.exponent})")
