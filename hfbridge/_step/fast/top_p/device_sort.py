"""HF's top-p cut on an accelerator, by HF's own arithmetic: one segmented sort on the device.

On a GPU the sort that `TopPLogitsWarper` runs is one fast kernel, no host read, and its result is
HF's by construction: the same ascending order of the scores, the same float32 softmax and running
sum, the same comparison. Only the order among exactly equal scores, which HF leaves to the sort, is
fixed here as on every other route of the fast path: the lowest ids are kept (equal values sit
side by side whatever their order, so the sums are bit for bit HF's). `sorted_top_p_keep` returns the
tokens kept instead of the scores, a chunk of rows at a time so that the sort's copies stay within a
bounded multiple of one chunk.

>>> import torch
>>> scores = torch.tensor([[0.0, 1.0, 1.0, 3.0]])
>>> sorted_top_p_keep(scores, 0.9, 1).tolist()
[[False, True, True, True]]
"""

from __future__ import annotations

import torch

from hfbridge._step.fast.top_p.mask import TopP, top_p_rows

__all__ = ["sorted_top_p_keep"]

_CHUNK = 1 << 22  # elements per chunk of rows: the sort's values, indices and running sum stay small


def sorted_top_p_keep(scores: torch.Tensor, top_p: TopP, at_least: int) -> torch.Tensor:
    """`(batch, vocab)` bool: the tokens `TopPLogitsWarper(top_p, min_tokens_to_keep=at_least)` keeps.

    Args:
        scores: `(batch, vocab)` float32 scores, temperature applied (read only).
        top_p, at_least: The warper's `top_p` (or `(batch, 1)` float64, one per row) and `min_tokens_to_keep`.
    """
    n, vocab = scores.shape
    rows = max(1, _CHUNK // max(vocab, 1))
    if rows >= n:
        return _keep(scores, top_p, at_least)
    return torch.cat([_keep(scores[start:start + rows], top_p_rows(top_p, slice(start, start + rows)), at_least)
                      for start in range(0, n, rows)])


def _keep(scores: torch.Tensor, top_p: TopP, at_least: int) -> torch.Tensor:
    # descending and stable puts equal scores in id order; flipped, ascending with the highest ids first
    ordered, order = torch.sort(scores, descending=True, stable=True)  # [N, V]
    ordered, order = ordered.flip(-1), order.flip(-1)
    running = ordered.softmax(dim=-1).cumsum_(dim=-1)  # [N, V]
    # HF compares with the Python float `1 - top_p`, which torch rounds to float32; per row, the same value
    threshold = (1 - top_p.double()).to(device=scores.device, dtype=torch.float32) if isinstance(top_p, torch.Tensor) \
        else 1 - top_p
    remove = running <= threshold
    remove[:, -at_least:] = False  # HF keeps the `min_tokens_to_keep` best
    return torch.empty_like(remove).scatter_(1, order, ~remove)
