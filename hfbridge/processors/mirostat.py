"""Mirostat 2.0 as a `transformers.LogitsProcessor` with one target surprise state per row.

Definition (per row), mirostat v2: keep the tokens whose surprise `-log2 p` is `<= mu` (at least
the most likely token; `p` the softmax of the scores received), i.e. `p >= 2 ** -mu`; the others get
`-inf`, so the draw that follows samples from the kept set renormalised (`p'`). At the next call the
token chosen, `X = input_ids[:, -1]`, updates the row's state:

    mu -= eta * (-log2 p'(X) - tau)

`mu` starts at `2 * tau` in every new sequence: a row of a call whose `input_ids` extend none of the
previous call's rows by one token (another batch, another prompt, a new `generate`) starts fresh,
so one instance can serve several `generate` calls, HF's included. A row that extends another row of
the previous call (HF's beam search reorders rows without telling the processors) takes that row's
state. A chosen token outside the kept set (something after mirostat chose it) leaves `mu` as it is.

It follows the stateful protocol (`processors/_stateful.py`) too: `reset()`, `reorder(beam_idx)` and
`rollback(lengths)` (back to the `mu` of the call on that many tokens), which hfbridge's loops call.

Reference: Basu et al., "Mirostat: A Neural Text Decoding Algorithm that Directly Controls
Perplexity" (ICLR 2021, arXiv:2007.14966), algorithm 2; llama.cpp `src/llama-sampler.cpp`,
`llama_sampler_mirostat_v2_apply` (which samples itself; here the draw is the caller's);
`common/common.h`: `mirostat = 0` (off), `mirostat_tau = 5.0`, `mirostat_eta = 0.1`. When the
most likely token alone exceeds `mu`, llama.cpp keeps exactly one token; so does this class when
the best score is unique, and keeps all tokens tied with it otherwise. Mirostat 1 (which estimates a
Zipf exponent and keeps a top-k) is not provided.

Batched and sync-free: the state is a `(rows,)` tensor on the scores' device; on CPU a host path cuts
from one fused softmax with `torch.threshold` per row (docs/samplers.md, "Cost").

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

from hfbridge.processors._host import fused_path, scores_owned, scratch
from hfbridge.processors._rows import RowParam, gate

__all__ = ["MirostatLogitsWarper"]

_HISTORY = 4096  # calls whose mu `rollback` can return to


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
        self._weights: torch.Tensor | None = None  # [B, V] last call's kept weights (any scale per row), else 0
        self._buffer: torch.Tensor | None = None  # [B, V] the host path's probabilities, kept for the next call
        self._kept_total: torch.Tensor | None = None  # [B, 1] their sum
        self._history: dict[int, torch.Tensor] = {}  # input length -> [B] the mu used at that call
        self._resume: tuple[torch.Tensor, torch.Tensor] | None = None  # ([B] mu, [B] bool) set by `rollback`

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Row `i` now continues what row `beam_idx[i]` was (HF's beam reorder); no host read."""
        index = beam_idx.long()
        for name in ("mu", "_ids", "_weights", "_kept_total"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, index.to(value.device)))
        if self._resume is not None:
            self._resume = tuple(part.index_select(0, index.to(part.device)) for part in self._resume)  # type: ignore
        self._history = {length: mu.index_select(0, index.to(mu.device)) for length, mu in self._history.items()}

    def rollback(self, lengths: torch.Tensor) -> None:
        """Each row's sequence now has `lengths[i]` tokens: its `mu` becomes the one the call on that many
        tokens used, as if the tokens after had never been seen (one past the last call continues it as usual).
        No host read."""
        if self.mu is None:
            return
        lengths = lengths.long().to(self.mu.device)  # [B]
        known = sorted(length for length, mu in self._history.items() if mu.shape == self.mu.shape)
        if not known:
            return
        stacked = torch.stack([self._history[length] for length in known])  # [L, B]
        table = torch.tensor(known, device=self.mu.device)  # [L]
        match = lengths[None, :] == table[:, None]  # [L, B]
        found = match.any(0)  # [B]
        picked = stacked.gather(0, match.long().argmax(0)[None, :]).squeeze(0)  # [B]
        self._resume = (picked, found)  # rows not found: one past the last call continues it, else fresh

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows = scores.shape[0]  # [B, V]
        device, dtype = scores.device, scores.dtype
        tau = self.tau.tensor(rows, device, dtype)
        mu = self._next_mu(input_ids, tau, scores)  # [B]
        kept = None
        if scores.shape[1] > 1 and fused_path(scores):
            kept = self._on_host(scores, mu)
        if kept is None:
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
        if input_ids is not None:
            self._history[input_ids.shape[1]] = mu
            if len(self._history) > _HISTORY:
                del self._history[min(self._history)]
        return kept

    def _on_host(self, scores: torch.Tensor, mu: torch.Tensor) -> torch.Tensor | None:
        """The same cut from one softmax, the comparisons as `torch.threshold` per row; None for a NaN row.

        `p >= 2^-mu` on `p = softmax(scores)` (torch's fused kernel; its exponentials are torch's fast
        ones, a few float32 ulps from `exp`, so a token within that of the cut may fall the other way),
        the best token always kept (`p >= max p`). The probabilities stay in a buffer of this
        instance, the removed ones zeroed, for the next call's update.
        """
        buffer = self._buffer
        if buffer is None or buffer.shape != scores.shape or buffer.dtype != scores.dtype:
            buffer = self._buffer = torch.empty_like(scores, memory_format=torch.contiguous_format)
        probs = torch.softmax(scores, -1, out=buffer)  # [B, V]
        floor = torch.minimum(torch.exp2(-mu)[:, None], probs.amax(-1, keepdim=True))  # [B, 1]
        below = torch.nextafter(floor, torch.tensor(-torch.inf, dtype=floor.dtype)).flatten().tolist()
        if not all(bound < torch.inf for bound in below):  # NaN (a row with NaN or +inf): the general path
            return None
        removal = scratch(scores)  # [B, V]
        for row, bound in enumerate(below):  # p > bound  <=>  p >= floor
            torch.threshold(probs[row], bound, -torch.inf, out=removal[row])
            torch.threshold_(probs[row], bound, 0.0)
        removal.clamp_(max=0.0)  # 0 kept, -inf removed
        kept = scores.add_(removal) if scores_owned() else scores + removal
        self._weights, self._kept_total = probs, probs.sum(-1, keepdim=True)  # p'(X) = probs[X] / kept total
        return kept

    def _next_mu(self, input_ids: torch.Tensor, tau: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Each row's mu for this call: updated from the token chosen after the last call, or 2 tau.

        A row continues the row of the last call whose tokens are its own but the last: the same row
        when it does (greedy, sampling), else the first that does (HF's beam search reorders the rows
        without telling the processors); a row that continues none starts fresh.
        """
        fresh = 2 * tau
        if input_ids is None:
            return fresh
        resume, self._resume = self._resume, None
        mu = self._continued(input_ids, tau, scores, fresh)
        if resume is not None and resume[0].shape == fresh.shape:
            mu = torch.where(resume[1], resume[0].to(fresh.dtype), mu)
        return mu

    def _continued(self, input_ids: torch.Tensor, tau: torch.Tensor, scores: torch.Tensor,
                   fresh: torch.Tensor) -> torch.Tensor:
        last = self._ids
        rows, length = input_ids.shape
        if (last is None or self.mu is None or self._weights is None or self._kept_total is None
                or last.shape[1] != length - 1 or self._weights.shape[1] != scores.shape[1]
                or last.device != input_ids.device):
            return fresh
        same = (input_ids[:, None, :-1] == last[None, :, :]).all(-1)  # [B, B_last]: row i continues row j
        found = same.any(-1)  # [B]
        own = torch.arange(rows, device=input_ids.device)
        diagonal = same.diagonal() if rows == last.shape[0] else torch.zeros_like(found)
        source = torch.where(diagonal, own.clamp(max=last.shape[0] - 1), same.long().argmax(-1))  # [B]
        chosen = input_ids[:, -1:].long()  # [B, 1]
        weights = self._weights[source[:, None], chosen]  # [B, 1]: one weight per row, no copy of the rows
        p = (weights / self._kept_total.index_select(0, source)).squeeze(1)  # [B] p'(X)
        surprise = -torch.log2(p)
        eta = self.eta.tensor(rows, scores.device, scores.dtype)
        previous = self.mu.index_select(0, source)
        updated = torch.where(p > 0, previous - eta * (surprise - tau), previous)
        return torch.where(found, updated, fresh)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tau={self.tau}, eta={self.eta})"
