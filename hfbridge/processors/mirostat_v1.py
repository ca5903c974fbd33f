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
(`_row_history.py`); sync-free and sort-free: the best `m` for the estimate (block maxima, then
`topk`), and each row's k-th best score by a radix select over the scores' bits (llama.cpp sorts
the row). On CPU a host path reads the k-th from the best scores listed (for `k` up to 4,096) and
cuts each row with `torch.threshold` (docs/samplers.md, "Cost").

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

from hfbridge.processors._cpu_side import fused_path
from hfbridge.processors._row_history import RowHistory
from hfbridge.processors._rows import RowParam, best_k, cut_below

__all__ = ["MirostatV1LogitsWarper"]

_LISTED = 4096  # the host path lists each row's best k + 1 scores up to this k (topk); beyond, the radix select


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

    # traits (`hfbridge.processors._traits`): it chooses the final token from a distribution of its own, and
    # llama.cpp runs it instead of its sampler chain
    picks_token = True
    replaces_chain = True

    def __init__(self, tau: Any = 5.0, eta: Any = 0.1, m: Any = 100):
        self.tau = RowParam("tau", tau, above=0.0)
        self.eta = RowParam("eta", eta, above=0.0)
        self.m = RowParam("m", m, integer=True, minimum=1)
        self._pairs = max(self.m.values) - 1
        self.reset()

    def reset(self) -> None:
        """Forget every row's state: the next call starts each one with `mu = 2 * tau`."""
        self._history = RowHistory(self.tau, self.eta, self.m)
        self._weights: torch.Tensor | None = None  # [B, V] last call's exp(score - best) where kept, else 0
        self._listed: tuple[torch.Tensor, torch.Tensor, int] | None = None  # or ([B, K] ids, their weights, V)
        self._kept_total: torch.Tensor | None = None  # [B, 1] their sum
        self.mu: torch.Tensor | None = None
        self.k: torch.Tensor | None = None

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Row `i` now continues row `beam_idx[i]`."""
        self._history.reorder(beam_idx)
        if self._kept_total is not None:
            index = beam_idx.to(self._kept_total.device).long()
            self._kept_total = self._kept_total[index]
            if self._weights is not None:
                self._weights = self._weights[index]
            if self._listed is not None:
                self._listed = (self._listed[0][index], self._listed[1][index], self._listed[2])

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
            raise ValueError("MirostatV1LogitsWarper reads the tokens chosen so far: pass `input_ids`.")
        rows, vocab = scores.shape  # [B, V]
        device, dtype = scores.device, scores.dtype
        tau = self.tau.tensor(rows, device, dtype)
        mu = self._mu(input_ids, tau, scores)  # [B]
        # the Zipf estimate over the best m tokens (llama.cpp's float arithmetic, on sorted probabilities)
        pairs = min(self._pairs, vocab - 1)
        top, top_ids = best_k(scores, pairs + 1)  # [B, P + 1], sorted (a prefilter by blocks, then topk)
        best = top[:, :1].clamp(min=torch.finfo(dtype).min)  # [B, 1]; a row of -inf stays
        # the host path: every row's P + 1 best finite, so at least P + 1 candidates (no count needed)
        host = fused_path(scores) and vocab >= 2 and bool(top[:, -1].isfinite().all())  # a host read: free on CPU
        candidates = torch.full((rows,), vocab, device=device) if host else (scores > -torch.inf).sum(-1)  # [B]
        if pairs > 0:
            # the estimate reads ratios of probabilities, where the softmax's normaliser cancels: the host
            # path skips it (no pass over the vocabulary; each ratio then rounds once instead of thrice)
            p = (top - best).exp()  # [B, P + 1] the best ones' weights, unnormalised
            if not host:
                p = p / (scores - best).exp().sum(-1, keepdim=True)  # [B, P + 1] softmax of the best
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
        if host:
            listed = self._listed_cut(scores, top, top_ids, k, best)
            if listed is not None:
                self._weights, self.mu, self.k = None, mu, k
                return listed
            k = torch.minimum(k, (scores > -torch.inf).sum(-1).clamp(min=1))  # the count the host path skipped
        kept = _at_least_kth(scores, k) & (scores > -torch.inf)  # the best k, and every token tied with the k-th
        out = scores.masked_fill(~kept, -torch.inf)
        weights = (out - best).exp()  # [B, V], 0 where removed
        self._weights, self._kept_total, self._listed = weights, weights.sum(-1, keepdim=True), None
        self.mu, self.k = mu, k
        return out

    def _mu(self, input_ids: torch.Tensor, tau: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Each row's mu for this call: its earlier state, updated by the token chosen since, or 2 tau."""
        history = self._history
        found = history.lookup(input_ids, width=1, dtype=scores.dtype, last_only=True)
        mu = torch.where(found.repeat, found.at[:, 0], 2 * tau)
        weights, listed, total = self._weights, self._listed, self._kept_total
        width = weights.shape[-1] if weights is not None else listed[2] if listed is not None else -1
        if total is not None and width == scores.shape[-1] and total.device == scores.device and input_ids.shape[1]:
            chosen = input_ids[:, -1:].long().clamp(0, width - 1)  # [B, 1]
            if weights is not None:
                p = (weights[found.source[:, None], chosen] / total[found.source])[:, 0]  # [B] p'(X), 0 if not kept
            else:
                ids, kept = listed[0][found.source], listed[1][found.source]  # type: ignore[index]  # [B, K]
                p = (kept * (ids == chosen)).sum(-1) / total[found.source][:, 0]  # [B] p'(X), 0 if not kept
            before = found.before[:, 0]
            eta = self.eta.tensor(scores.shape[0], scores.device, scores.dtype)
            updated = torch.where(p > 0, before - eta * (-torch.log2(p) - tau), before)
            mu = torch.where(found.previous, updated, mu)
        history.record(input_ids, found, mu[:, None])
        return mu

    def _listed_cut(self, scores: torch.Tensor, top: torch.Tensor, top_ids: torch.Tensor, k: torch.Tensor,
                    best: torch.Tensor) -> torch.Tensor | None:
        """The host path's cut (None where it does not apply): each row's k-th best from its listed best scores.

        The best `P + 1` scores are listed already (the estimate's); a larger `k` (up to 4,096) lists
        `max(k) + 1` of them once for the batch. The k-th is then read from the list, and when
        the next listed score is below it, every token the row keeps is listed: the row is cut by
        `torch.threshold` (one pass) and only the listed weights are kept for the next update. Ties
        reaching past the list, a k-th at -inf (fewer candidates), narrow rows: the general path.
        """
        vocab = scores.shape[1]  # [B, V]
        most = int(k.max())  # a host read: free on CPU
        if most >= top.shape[1]:
            if most >= min(_LISTED, vocab):
                return None
            top, top_ids = best_k(scores, most + 1)  # [B, K]
        threshold = top.gather(1, (k - 1)[:, None])  # [B, 1] the k-th best, ties counted
        if not bool(((top[:, -1:] < threshold) & threshold.isfinite()).all()):
            return None
        out = cut_below(scores, threshold)
        if out is None:
            return None
        kept = torch.where(top >= threshold, (top - best).exp(), 0.0)  # [B, K] exp(score - best) of the kept
        self._listed, self._kept_total = (top_ids, kept, vocab), kept.sum(-1, keepdim=True)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tau={self.tau}, eta={self.eta}, m={self.m})"


def _at_least_kth(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """`(rows, vocab)` bool: the scores `>=` each row's `k[row]`-th largest (`1 <= k <= vocab`), without a sort.

    float32 scores are read as ordered ints (the sign bit flips the others, so that integer order is
    float order; -0.0 first made +0.0), and the k-th largest is found a byte at a time, from the top
    (a radix select): a histogram of the next byte among the keys that share the bytes found so far,
    and the bucket where the count from the top reaches `k`. Four histograms, per row at once, no host
    read; about half the time of a sort on CPU. Other dtypes sort.
    """
    if scores.dtype != torch.float32:
        threshold = scores.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
        return scores >= threshold
    rows = scores.shape[0]
    bits = (scores + 0.0).view(torch.int32)  # [B, V]; + 0.0 turns -0.0 into +0.0
    keys = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed order = float order
    unsigned = keys ^ torch.iinfo(torch.int32).min  # the same order read as unsigned bits: bytes from the top
    ones = torch.ones(1, dtype=torch.long, device=scores.device).expand(*scores.shape)
    remaining = k  # [B] the rank still to find among the keys that share the prefix
    prefix = torch.zeros_like(k)  # [B] the k-th key's bytes found so far
    for shift in (24, 16, 8, 0):
        digit = (unsigned >> shift) & 255  # [B, V]
        if shift != 24:  # keys off the prefix go to bucket 256
            high = (unsigned >> (shift + 8)) & ((1 << (24 - shift)) - 1)
            digit = torch.where(high == prefix.to(torch.int32)[:, None], digit, 256)
        counts = torch.zeros(rows, 257, dtype=torch.long, device=scores.device).scatter_add_(1, digit.long(), ones)
        at_or_above = counts[:, :256].flip(-1).cumsum(-1).flip(-1)  # [B, 256] keys with this byte or a higher one
        byte = (at_or_above >= remaining[:, None]).sum(-1) - 1  # [B] the highest byte reaching the rank
        above = at_or_above.gather(1, (byte + 1).clamp(max=255)[:, None])[:, 0]
        remaining = remaining - torch.where(byte < 255, above, 0)
        prefix = prefix * 256 + byte
    return keys >= (prefix - 2**31).to(torch.int32)[:, None]  # back to the signed key
