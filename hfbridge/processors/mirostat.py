"""Mirostat 2.0 as a `transformers.LogitsProcessor` with one target surprise state per row.

Definition (per row), mirostat v2: keep the tokens whose surprise `-log2 p` is `<= mu` (at least
the most likely token; `p` the softmax of the scores received), i.e. `p >= 2 ** -mu`; the others get
`-inf`, so the draw that follows samples from the kept set renormalised (`p'`). At the next call the
token chosen, `X = input_ids[:, -1]`, updates the row's state:

    mu -= eta * (-log2 p'(X) - tau)

`mu` starts at `2 * tau` in every new sequence: a row of a call whose `input_ids` extend none of the
previous call's rows by one token (another batch, another prompt, a new `generate`) starts fresh,
so one instance can serve several `generate` calls, HF's included. One state per row, following rows
by their tokens (`_row_history.py`): a row that extends another row of the previous call (HF's beam
search reorders rows without telling the processors) takes that row's state, and a call on tokens
seen before takes the state it had then. A chosen token outside the kept set (something after
mirostat chose it) leaves `mu` as it is.

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

from hfbridge.processors._cpu_side import fused_path, scores_owned, scratch
from hfbridge.processors._row_history import RowHistory
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

    # traits (`hfbridge.processors._traits`): it chooses the final token from a distribution of its own, and
    # llama.cpp runs it instead of its sampler chain
    picks_token = True
    replaces_chain = True

    def __init__(self, tau: Any = 5.0, eta: Any = 0.1):
        self.tau = RowParam("tau", tau, above=0.0)
        self.eta = RowParam("eta", eta, above=0.0)
        self.reset()

    def reset(self) -> None:
        """Forget every row's state: the next call starts with `mu = 2 * tau`."""
        self.mu: torch.Tensor | None = None  # [B]
        self._history = RowHistory(self.tau, self.eta)  # each row's mu per length, and the last call's tokens
        self._weights: torch.Tensor | None = None  # [B, V] last call's kept weights (any scale per row), else 0
        self._buffer: torch.Tensor | None = None  # [B, V] the host path's probabilities, kept for the next call
        self._kept_total: torch.Tensor | None = None  # [B, 1] their sum

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Row `i` now continues what row `beam_idx[i]` was (HF's beam reorder); no host read."""
        self._history.reorder(beam_idx)
        index = beam_idx.long()
        for name in ("mu", "_weights", "_kept_total"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, index.to(value.device)))

    def follow(self, source: torch.Tensor) -> None:
        """At the next call only: row `i` continues row `source[i]` of the last call (`(rows,)` long, -1: a new
        sequence), as the caller says, instead of matching rows by their tokens; `input_ids[:, -1]` is still
        the token chosen since. hfbridge's vLLM processor runs one chain for the requests of equal options
        this way. No host read."""
        self._history.follow(source)

    def rollback(self, lengths: torch.Tensor) -> None:
        """Each row's sequence now has `lengths[i]` tokens: its `mu` becomes the one the call on that many
        tokens used, as if the tokens after had never been seen (one past the last call continues it as usual).
        No host read."""
        self._history.rollback(lengths)

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
        self.mu = mu
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

    def _next_mu(self, input_ids: torch.Tensor | None, tau: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Each row's mu for this call: its earlier state, updated by the token chosen since, or 2 tau.

        A row takes the state of the row of an earlier call with its tokens (`_row_history.py`): the
        same row when it does (greedy, sampling), else one with the same per-row values (HF's beam
        search reorders the rows without telling the processors); the update reads the last call's
        kept weights, so only a row continuing the last call is updated; any other row starts fresh.
        """
        fresh = 2 * tau
        history = self._history
        if input_ids is None:
            history.reset()  # nothing to follow rows by: the next call starts fresh too
            return fresh
        found = history.lookup(input_ids, width=1, dtype=scores.dtype, last_only=True)
        mu = torch.where(found.repeat, found.at[:, 0], fresh)
        weights, total = self._weights, self._kept_total
        if weights is not None and total is not None and weights.shape[1] == scores.shape[1] \
                and weights.device == scores.device and input_ids.shape[1]:
            chosen = input_ids[:, -1:].long().clamp(0, weights.shape[1] - 1)  # [B, 1]
            p = (weights[found.source[:, None], chosen] / total[found.source])[:, 0]  # [B] p'(X), 0 if not kept
            eta = self.eta.tensor(scores.shape[0], scores.device, scores.dtype)
            before = found.before[:, 0]
            updated = torch.where(p > 0, before - eta * (-torch.log2(p) - tau), before)
            mu = torch.where(found.previous, updated, mu)
        history.record(input_ids, found, mu[:, None])
        return mu

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tau={self.tau}, eta={self.eta})"
