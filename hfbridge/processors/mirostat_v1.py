"""Mirostat 1.0 as a `transformers.LogitsProcessor` with one target surprise state per row.

Definition (per row), llama.cpp's `llama_sampler_mirostat_apply` (Basu et al., ICLR 2021,
arXiv:2007.14966, algorithm 1): `p` is the softmax of the scores received, sorted in decreasing
order over the tokens above -inf (llama.cpp's candidates). A Zipf exponent is estimated from the
`m` most likely tokens,

    s = sum_i t_i b_i / sum_i t_i^2,   t_i = ln((i + 2) / (i + 1)),   b_i = ln(p_i / p_(i+1)),

for `i < min(m - 1, candidates - 1)`; then, with `e = s - 1` and `N` the vocabulary's width,

    k = ((e * 2^mu) / (1 - N^-e)) ^ (1 / s)

and the row keeps its `max(int(k), 1)` best tokens (all those tied with the last one, as HF's
top-k; llama.cpp keeps exactly k of them in an unspecified order); the others get -inf. At the
next call the token chosen, `X = input_ids[:, -1]`, updates the state, as in mirostat 2:

    mu -= eta * (-log2 p'(X) - tau)

with `p'` the kept tokens' renormalised probabilities; `mu` starts at `2 * tau` in every new
sequence, and a chosen token outside the kept set leaves it as it is. Where llama.cpp's conversion
of `k` to an int is undefined (NaN, as when one candidate leaves no pair, or infinite), this class
keeps one token for NaN and every candidate for a `k` beyond them.

Defaults (llama.cpp `common/common.h`, `common/sampling.cpp`): `mirostat_tau = 5.0`,
`mirostat_eta = 0.1`, `m = 100`. One state per row, following rows by their tokens
(`_row_history.py`); sync-free (one sort of the scores per call, as llama.cpp's).

>>> import torch
>>> warper = MirostatV1LogitsWarper(tau=1.0, eta=0.1)          # mu = 2 tau = 2
>>> warper(torch.tensor([[0]]), torch.tensor([[0.5, 0.25, 0.15, 0.1]]).log()).isfinite().tolist()
[[True, True, False, False]]
>>> warper.k.tolist()                                        # s = 1.105, k = 2.79
[2]
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor

from hfbridge.processors._row_history import RowHistory
from hfbridge.processors._rows import RowParam

__all__ = ["MirostatV1LogitsWarper"]


class MirostatV1LogitsWarper(LogitsProcessor):
    """Mirostat 1.0: a top-k from a Zipf estimate and `mu`, and `mu` steered towards `tau` (see the module).

    Args:
        tau: The target surprise in bits (> 0). Default: 5.0. One value, or one per row.
        eta: The learning rate of `mu` (> 0). Default: 0.1. One value, or one per row.
        m: How many of the most likely tokens estimate the Zipf exponent (int >= 1). Default: 100.
            One value, or one per row.

    Attributes:
        mu: `(rows,)` the state used by the last call (None before the first).
        k: `(rows,)` the number of tokens the last call kept, before ties (None before the first).
    """

    def __init__(self, tau: Any = 5.0, eta: Any = 0.1, m: Any = 100):
        self.tau = RowParam("tau", tau, above=0.0)
        self.eta = RowParam("eta", eta, above=0.0)
        self.m = RowParam("m", m, integer=True, minimum=1)
        self._pairs = max(self.m.values) - 1
        self.reset()

    def reset(self) -> None:
        """Forget every row's state: the next call starts each one with `mu = 2 * tau`."""
        self._history = RowHistory()
        self._weights: torch.Tensor | None = None  # [B, V] last call's exp(score - best) where kept, else 0
        self._kept_total: torch.Tensor | None = None  # [B, 1] their sum
        self.mu: torch.Tensor | None = None
        self.k: torch.Tensor | None = None

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Row `i` now continues row `beam_idx[i]`."""
        self._history.reorder(beam_idx)
        if self._weights is not None and self._kept_total is not None:
            index = beam_idx.to(self._weights.device).long()
            self._weights, self._kept_total = self._weights[index], self._kept_total[index]

    def rollback(self, lengths: torch.Tensor) -> None:
        """Row `i` now has `lengths[i]` tokens; its state is what it was then."""
        self._history.rollback(lengths)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids is None:
            raise ValueError("MirostatV1LogitsWarper reads the tokens chosen so far: pass `input_ids`.")
        rows, vocab = scores.shape  # [B, V]
        device, dtype = scores.device, scores.dtype
        tau = self.tau.tensor(rows, device, dtype)
        mu = self._mu(input_ids, tau, scores)  # [B]
        # the Zipf estimate over the best m tokens (llama.cpp's float arithmetic, on sorted probabilities)
        ordered = scores.sort(dim=-1, descending=True).values  # [B, V]
        pairs = min(self._pairs, vocab - 1)
        candidates = (scores > -torch.inf).sum(-1)  # [B]
        if pairs > 0:
            top = ordered[:, :pairs + 1]  # [B, P + 1]
            best = top[:, :1].clamp(min=torch.finfo(dtype).min)
            p = (top - best).exp() / (scores - best).exp().sum(-1, keepdim=True)  # [B, P + 1] softmax of the best
            i = torch.arange(pairs, device=device, dtype=dtype)
            t = torch.log((i + 2) / (i + 1))  # [P]
            b = torch.log(p[:, :-1] / p[:, 1:])  # [B, P]
            used = (i < (self.m.tensor(rows, device, dtype) - 1)[:, None]) & (i < (candidates - 1)[:, None])
            s_hat = (t * b).where(used, 0.0).sum(-1) / (t * t).where(used, 0.0).sum(-1)  # [B]; 0/0 = NaN
        else:
            s_hat = torch.full((rows,), torch.nan, device=device, dtype=dtype)
        epsilon = s_hat - 1
        k = ((epsilon * torch.exp2(mu)) / (1 - torch.pow(float(vocab), -epsilon))).pow(1 / s_hat)  # [B]
        k = k.double().nan_to_num(nan=1.0).clamp(1.0, float(vocab)).floor().long()  # int(k), at least 1
        k = torch.minimum(k, candidates.clamp(min=1))
        threshold = ordered.gather(1, (k - 1)[:, None])  # [B, 1] the k-th best score
        kept = (scores >= threshold) & (scores > -torch.inf)
        out = scores.masked_fill(~kept, -torch.inf)
        top_score = ordered[:, :1].clamp(min=torch.finfo(dtype).min)
        weights = (out - top_score).exp()  # [B, V], 0 where removed
        self._weights, self._kept_total = weights, weights.sum(-1, keepdim=True)
        self.mu, self.k = mu, k
        return out

    def _mu(self, input_ids: torch.Tensor, tau: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Each row's mu for this call: its earlier state, updated by the token chosen since, or 2 tau."""
        history = self._history
        found = history.lookup(input_ids, width=1, dtype=scores.dtype, last_only=True)
        mu = torch.where(found.repeat, found.at[:, 0], 2 * tau)
        weights, total = self._weights, self._kept_total
        if weights is not None and total is not None and weights.shape[-1] == scores.shape[-1] \
                and weights.device == scores.device:
            chosen = input_ids[:, -1:].long().clamp(0, weights.shape[-1] - 1)  # [B, 1]
            p = (weights[found.source].gather(1, chosen) / total[found.source])[:, 0]  # [B] p'(X), 0 if not kept
            before = found.before[:, 0]
            eta = self.eta.tensor(scores.shape[0], scores.device, scores.dtype)
            updated = torch.where(p > 0, before - eta * (-torch.log2(p) - tau), before)
            mu = torch.where(found.previous, updated, mu)
        history.record(input_ids, found, mu[:, None])
        return mu

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tau={self.tau}, eta={self.eta}, m={self.m})"
