"""Top-nσ sampling as a `transformers.LogitsProcessor`.

Definition (per row): keep the tokens whose score is `>= max - n * sigma`, where `max` and `sigma`
(the population standard deviation) are taken over the row's finite scores; the others get
`filter_value`. Scaling every score by `1 / T` scales `max` and `sigma` alike, so the kept set does
not depend on the temperature (the paper's point). `min_tokens_to_keep` keeps at least that many
of the best tokens.

Reference: Tang et al., "Top-nσ: Not All Logits Are You Need" (2024, arXiv:2411.07641); llama.cpp
`src/llama-sampler.cpp`, `llama_sampler_top_n_sigma_apply` (whose semantics this follows: `-inf`
scores are left out of the mean and deviation); `common/common.h`: `top_n_sigma = -1.0` (off). In
llama.cpp `n <= 0` means "off"; here `n` must be > 0 (pass no option for off). text-generation-webui
computes the deviation over every score (`-inf` included, which gives NaN) and applies it after
temperature, as here.

Batched and sync-free: a handful of passes over the scores, no sort, no host read on an accelerator; on
CPU a host path of four passes and a cut per row (docs/samplers.md, "Cost").

>>> import torch
>>> scores = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).log()
>>> TopNSigmaLogitsWarper(1.0)(None, scores).softmax(-1)
tensor([[0.0000, 0.0000, 0.4286, 0.5714]])
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor

from hfbridge.processors._cpu_side import fused_path, scratch
from hfbridge.processors._rows import RowParam, cut_below, described, finite_count, gate

__all__ = ["TopNSigmaLogitsWarper"]


class TopNSigmaLogitsWarper(LogitsProcessor):
    """Keep scores `>= max - n * sigma` (see the module).

    Args:
        n: How many standard deviations below the best score to keep (> 0). One value, or one per row.
        filter_value: The score of a removed token. Default: -inf.
        min_tokens_to_keep: Keep at least this many of the best tokens (int >= 1). Default: 1.
    """

    keeps_ids_intact = True  # traits (`hfbridge.processors._traits`): keeps no ids
    reads_ids = False  # nor reads them: an engine may skip building the histories
    sampler_name = "top_n_sigma"

    def __init__(self, n: Any, filter_value: float = -float("inf"), min_tokens_to_keep: int = 1):
        self.n = RowParam("n", n, above=0.0)
        if isinstance(min_tokens_to_keep, bool) or not isinstance(min_tokens_to_keep, int) or min_tokens_to_keep < 1:
            raise ValueError(f"`min_tokens_to_keep` must be an int >= 1, got {described(min_tokens_to_keep)}.")
        self.filter_value = filter_value
        self.min_tokens_to_keep = min_tokens_to_keep

    def __call__(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        rows, vocab = scores.shape  # [B, V]
        if fused_path(scores):
            out = self._on_host(scores)
            if out is not None:
                return out
        best = scores.amax(-1, keepdim=True)  # [B, 1]
        shifted = scores - best.clamp(min=torch.finfo(scores.dtype).min)  # [B, V] for stable sums; -inf stays
        count = finite_count(shifted)  # [B, 1] earlier processors' removals are left out
        shifted = shifted.nan_to_num_(neginf=0.0)  # they add nothing to the sums
        mean = shifted.sum(-1, keepdim=True) / count
        variance = (torch.linalg.vecdot(shifted, shifted)[:, None] / count - mean.square()).clamp(min=0)
        floor = best - self.n.tensor(rows, scores.device, scores.dtype)[:, None] * variance.sqrt()
        if self.min_tokens_to_keep > 1:
            kth = scores.topk(min(self.min_tokens_to_keep, vocab), dim=-1).values[:, -1:]
            floor = torch.minimum(floor, kth)
        return self._cut(scores, floor)

    def _on_host(self, scores: torch.Tensor) -> torch.Tensor | None:
        """Rows without -inf, +inf or NaN (None otherwise): four passes and the cut, no mask.

        The deviation from the sum of squares of `scores - best` (`vector_norm`, one vectorised
        pass) instead of their dot product: the same quantity summed in another order (float32 rounding,
        a relative 1e-6 of the sums; `tests/processors/test_samplers_fused.py` bounds the floor's change).
        """
        rows, vocab = scores.shape  # [B, V]
        best = scores.amax(-1, keepdim=True)  # [B, 1]
        shifted = torch.sub(scores, best, out=scratch(scores))  # [B, V] <= 0
        total = shifted.sum(-1, keepdim=True)  # [B, 1]; not finite where a row holds -inf, +inf or NaN
        if not bool(total.isfinite().all()):  # a host read: free on CPU
            return None
        mean = total / vocab
        squares = torch.linalg.vector_norm(shifted, dim=-1, keepdim=True).square()  # [B, 1]
        variance = (squares / vocab - mean.square()).clamp(min=0)
        floor = best - self.n.tensor(rows, scores.device, scores.dtype)[:, None] * variance.sqrt()
        if self.min_tokens_to_keep > 1:
            kth = scores.topk(min(self.min_tokens_to_keep, vocab), dim=-1).values[:, -1:]
            floor = torch.minimum(floor, kth)
        return self._cut(scores, floor)

    def _cut(self, scores: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
        cut = cut_below(scores, floor, self.filter_value)  # one pass on the host path
        if cut is not None:
            return cut
        if self.filter_value == -torch.inf:
            return scores + gate(scores, floor)
        return scores.masked_fill(scores < floor, self.filter_value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, min_tokens_to_keep={self.min_tokens_to_keep})"
