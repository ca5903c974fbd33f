"""Mirostat 2.0 as a `transformers.LogitsProcessor` with one target surprise state per row.

Definition (per row), mirostat v2: keep the tokens whose surprise `-log2 p` is `<= mu` (at least
the most likely token; `p` the softmax of the scores received), i.e. `p >= 2 ** -mu`; the others get
`-inf`, so the draw that follows samples from the kept set renormalised (`p'`). At the next call the
token chosen, `X = input_ids[:, -1]`, updates the row's state:

    mu -= eta * (-log2 p'(X) - tau)

`mu` starts at `2 * tau` in every new sequence: a call whose `input_ids` do not extend the previous
call's by one token (another batch, another prompt, a new `generate`) starts every such row fresh,
so one instance can serve several `generate` calls, HF's included. A chosen token outside the kept
set (something after mirostat chose it) leaves `mu` as it is.

Reference: Basu et al., "Mirostat: A Neural Text Decoding Algorithm that Directly Controls
Perplexity" (ICLR 2021, arXiv:2007.14966), algorithm 2; llama.cpp `src/llama-sampler.cpp`,
`llama_sampler_mirostat_v2_apply` (which samples itself; here the draw is the caller's);
`common/common.h`: `mirostat = 0` (off), `mirostat_tau = 5.0`, `mirostat_eta = 0.1`. When the
most likely token alone exceeds `mu`, llama.cpp keeps exactly one token; so does this class when
the best score is unique, and keeps all tokens tied with it otherwise. Mirostat 1 (which estimates a
Zipf exponent and keeps a top-k) is not provided.

Batched and sync-free: the state is a `(rows,)` tensor on the scores' device.

>>> import torch
>>> warper = MirostatLogitsWarper(tau=1.0, eta=0.5)          # mu starts at 2 bits: keep p >= 0.25
>>> warper(torch.tensor([[0]]), torch.tensor([[0.5, 0.3, 0.2]]).log()).isfinite().tolist()
[[True, True, False]]
>>> warper.mu.tolist()
[2.0]
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor

from hfbridge.processors._rows import RowParam, gate

__all__ = ["MirostatLogitsWarper"]


class MirostatLogitsWarper(LogitsProcessor):
    """Mirostat 2.0: truncate to surprise `<= mu`, and steer `mu` towards `tau` (see the module).

    Args:
        tau: The target surprise in bits (> 0). Default: 5.0. One value, or one per row.
        eta: The learning rate of `mu` (> 0). Default: 0.1. One value, or one per row.

    Attributes:
        mu: `(rows,)` the current state after the last call (None before the first).
    """

    def __init__(self, tau: Any = 5.0, eta: Any = 0.1):
        self.tau = RowParam("tau", tau, above=0.0)
        self.eta = RowParam("eta", eta, above=0.0)
        self.reset()

    def reset(self) -> None:
        """Forget every row's state: the next call starts with `mu = 2 * tau`."""
        self.mu: torch.Tensor | None = None  # [B]
        self._ids: torch.Tensor | None = None  # [B, T] the last call's input_ids
        self._weights: torch.Tensor | None = None  # [B, V] last call's exp(score - best) where kept, else 0
        self._kept_total: torch.Tensor | None = None  # [B, 1] their sum

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows = scores.shape[0]  # [B, V]
        device, dtype = scores.device, scores.dtype
        tau = self.tau.tensor(rows, device, dtype)
        mu = self._next_mu(input_ids, tau, scores)  # [B]
        best = scores.amax(-1, keepdim=True).clamp(min=torch.finfo(dtype).min)  # [B, 1]; a row of -inf stays
        weights = (scores - best).exp_()  # [B, V] unnormalised p
        total = weights.sum(-1, keepdim=True)  # [B, 1]
        # -log2 p <= mu  <=>  p >= 2^-mu; the best token (weight 1) always stays
        floor = torch.minimum(torch.exp2(-mu)[:, None] * total, torch.ones_like(total))
        removal = gate(weights, floor)  # [B, V]: 0 kept, -inf removed
        kept = scores + removal
        self._weights = weights.mul_(removal.clamp_(min=-1.0).add_(1.0))  # kept weights, 0 elsewhere
        self._kept_total = weights.sum(-1, keepdim=True)  # [B, 1]; p'(X) = weights[X] / kept_total
        self._ids = input_ids  # generate makes a new tensor each step; the old one is not written
        self.mu = mu
        return kept

    def _next_mu(self, input_ids: torch.Tensor, tau: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Each row's mu for this call: updated from the token chosen after the last call, or 2 tau."""
        fresh = 2 * tau
        last = self._ids
        if input_ids is None:
            return fresh
        rows, length = input_ids.shape
        if (last is None or self.mu is None or self._weights is None or self._kept_total is None
                or last.shape != (rows, length - 1) or self._weights.shape != scores.shape
                or last.device != input_ids.device):
            return fresh
        continues = (input_ids[:, :-1] == last).all(-1)  # [B]: the same sequence, one token longer
        chosen = input_ids[:, -1:].long()  # [B, 1]
        p = (self._weights.gather(1, chosen) / self._kept_total).squeeze(1)  # [B] p'(X), 0 if not kept
        surprise = -torch.log2(p)
        eta = self.eta.tensor(rows, scores.device, scores.dtype)
        updated = torch.where(p > 0, self.mu - eta * (surprise - tau), self.mu)
        return torch.where(continues, updated, fresh)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tau={self.tau}, eta={self.eta})"
