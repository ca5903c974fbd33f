"""Adaptive-p: favour the tokens whose probability is near a target that moves with what was chosen.

Definition (per row), llama.cpp's `llama_sampler_adaptive_p_apply` (PR #17927): `p` is the softmax
of the scores received. The adapted target is

    a = clamp(2 * target - weighted_sum / total_weight, 0, 1)

and every token's new score is `5 - 10 * d^2 / (1 + d)` with `d = |p - a| / 0.3` (quadratic near the
target, linear far from it); a token at -inf stays there. The draw that follows samples from these
scores. At the next call the token chosen, `X = input_ids[:, -1]`, updates the running average of
the *original* probabilities of the chosen tokens:

    weighted_sum = p(X) + decay * weighted_sum,    total_weight = 1 + decay * total_weight

starting from `weighted_sum = target / (1 - decay)`, `total_weight = 1 / (1 - decay)` in every new
sequence. A chosen token this warper had removed (at -inf) leaves the average as it is, as
llama.cpp's `accept` skips a token it did not select. A negative target turns the row off (its
scores pass unchanged, llama.cpp's plain `dist`).

Defaults (llama.cpp `common/common.h`): `adaptive_target = -1.0` (off), `adaptive_decay = 0.90`;
llama.cpp clamps the decay into [0, 0.99], this class refuses values outside. llama.cpp puts the
sampler at the very end of the chain, where it replaces the final draw; so do hfbridge's options.

One state per row, following rows by their tokens (`_row_history.py`): it works in hfbridge's loops,
which call `reset` / `reorder` / `rollback`, and in transformers' own `generate`. Sync-free on an
accelerator; on CPU a host path of fused passes (docs/samplers.md, "Cost").

>>> import torch
>>> warper = AdaptivePLogitsWarper(target=0.3, decay=0.9)
>>> out = warper(torch.tensor([[0]]), torch.tensor([[0.6, 0.3, 0.1]]).log())
>>> out.softmax(-1).argmax(-1).item()                           # the token nearest p = 0.3 is now likeliest
1
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor

from hfbridge.processors._cpu_side import fused_path, scores_owned, scratch
from hfbridge.processors._row_history import RowHistory
from hfbridge.processors._rows import RowParam

__all__ = ["AdaptivePLogitsWarper"]

_WIDTH, _PEAK, _SHARPNESS = 0.3, 5.0, 10.0  # llama.cpp's DISTRIBUTION_WIDTH, PEAK_LOGIT_VALUE, SHARPNESS


class AdaptivePLogitsWarper(LogitsProcessor):
    """Adaptive-p (see the module).

    Args:
        target: The target probability, <= 1; negative = off. Default: -1.0. One value, or one per row.
        decay: The running average's decay, in [0, 0.99]; its memory is about `1 / (1 - decay)`
            tokens. Default: 0.9. One value, or one per row.

    Attributes:
        state: `(rows, 2)` each row's `(weighted_sum, total_weight)` used by the last call (None before).
    """

    sampler_name = "adaptive_p"  # traits (`hfbridge.processors._traits`): llama.cpp's name
    picks_token = True  # it chooses the final token from a distribution of its own

    def __init__(self, target: Any = -1.0, decay: Any = 0.9):
        self.target = RowParam("target", target, maximum=1.0)
        self.decay = RowParam("decay", decay, minimum=0.0, maximum=0.99)
        self.reset()

    def reset(self) -> None:
        """Forget every row: the next call starts each one fresh."""
        self._history = RowHistory(self.target, self.decay)
        self._probs: torch.Tensor | None = None  # [B, V] last call's p where kept, NaN where removed
        self._buffer: torch.Tensor | None = None  # [B, V] the host path's p, kept for the next call
        self.state: torch.Tensor | None = None

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Row `i` now continues row `beam_idx[i]`."""
        self._history.reorder(beam_idx)
        if self._probs is not None:
            self._probs = self._probs[beam_idx.to(self._probs.device).long()]

    def follow(self, source: torch.Tensor) -> None:
        """At the next call only: row `i` continues row `source[i]` of the last call (`(rows,)` long, -1: a new
        sequence), as the caller says, instead of matching rows by their tokens; `input_ids[:, -1]` is still
        the token chosen since. hfbridge's vLLM processor runs one chain for the requests of equal options
        this way. No host read."""
        self._history.follow(source)

    def rollback(self, lengths: torch.Tensor) -> None:
        """Row `i` now has `lengths[i]` tokens; its state is what it was then."""
        self._history.rollback(lengths)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids is None:
            raise ValueError("AdaptivePLogitsWarper reads the tokens chosen so far: pass `input_ids`.")
        rows = scores.shape[0]  # [B, V]
        device, dtype = scores.device, scores.dtype
        target = self.target.tensor(rows, device, dtype)  # [B]
        decay = self.decay.tensor(rows, device, dtype)
        history = self._history
        found = history.lookup(input_ids, width=2, dtype=dtype, last_only=True)
        fresh = torch.stack([target / (1 - decay), 1 / (1 - decay)], dim=-1)  # [B, 2]
        state = torch.where(found.repeat[:, None], found.at, fresh)
        probs = self._probs
        if probs is not None and probs.shape[-1] == scores.shape[-1] and probs.device == device \
                and input_ids.shape[1]:
            # the token chosen after the last call, with its original probability there (NaN: not ours)
            token = input_ids[:, -1:].long().clamp(0, probs.shape[-1] - 1)  # [B, 1]
            chosen = probs[found.source[:, None], token][:, 0]  # one value per row, no copy of the rows
            total, weight = found.before.unbind(-1)
            updated = torch.stack([chosen + decay * total, 1 + decay * weight], dim=-1)
            updated = torch.where(chosen.isnan()[:, None], found.before, updated)
            state = torch.where(found.previous[:, None], updated, state)
        history.record(input_ids, found, state)
        self.state = state
        weighted_sum, total_weight = state.unbind(-1)
        average = torch.where(total_weight == 0, target, 2 * target - weighted_sum / total_weight)
        adapted = average.clamp(0.0, 1.0)[:, None]  # [B, 1]
        if self.target.all(lambda t: t >= 0) and fused_path(scores) and bool(scores.amin() > -torch.inf):
            return self._on_host(scores, adapted)  # every row on, no removed token, no NaN
        p = scores.softmax(-1)  # [B, V]
        removed = scores == -torch.inf
        distance = (p - adapted).abs_().mul_(1 / _WIDTH)  # d = |p - a| / 0.3
        new = distance.square()
        new = new.div_(distance.add_(1.0)).mul_(-_SHARPNESS).add_(_PEAK).masked_fill_(removed, -torch.inf)
        if self.target.all(lambda t: t >= 0):  # every row on (host values, no read)
            self._probs = p.masked_fill_(removed, torch.nan)  # NaN: a token this warper removed
            return new
        on = (target >= 0)[:, None]  # [B, 1]
        self._probs = p.masked_fill_(removed | ~on, torch.nan)
        return torch.where(on, new, scores)

    def _on_host(self, scores: torch.Tensor, adapted: torch.Tensor) -> torch.Tensor:
        """Every row on, no score at -inf: the transform in five fused passes after the softmax.

        `10 d^2 / (1 + d)` with `d = e / w` (`e = |p - a|`, `w = 0.3`) is `(10 / w) e^2 / (w + e)`:
        `p - a`, `|p - a| + w` (in the result's memory), the square, and `addcdiv` writing
        `5 - (10 / w) e^2 / (w + e)` over it (the result: the scores themselves when owned). The same
        values within float32 rounding (a few ulps; the tests compare with the reference at 1e-5).
        """
        buffer = self._buffer
        if buffer is None or buffer.shape != scores.shape or buffer.dtype != scores.dtype:
            buffer = self._buffer = torch.empty_like(scores, memory_format=torch.contiguous_format)
        p = torch.softmax(scores, -1, out=buffer)  # [B, V], read at the next call
        diff = torch.sub(p, adapted, out=scratch(scores))  # [B, V] p - a
        out = scores if scores_owned() else torch.empty_like(scores, memory_format=torch.contiguous_format)
        spread = torch.abs(diff, out=out).add_(_WIDTH)  # |p - a| + w, in the result's memory
        peak = torch.tensor(_PEAK, dtype=scores.dtype)
        torch.addcdiv(peak, diff.square_(), spread, value=-_SHARPNESS / _WIDTH, out=out)  # elementwise: in place
        self._probs = p
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(target={self.target}, decay={self.decay})"
