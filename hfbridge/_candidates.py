"""HF's top-p cut among the best-scoring tokens, when a check proves they hold it.

`top_candidates` selects the best `k` scores with `torch.topk` (a selection, not a sort of the
row); `top_p_count` finds HF's cut among them; `top_p_candidates` tries growing `k` and declines
(returns None) when the candidates cannot prove the cut, leaving it to the radix select of
`_top_p.py`. CPU eager only: each try reads one flag.

>>> top_candidates(torch.tensor([[0.0, 3.0, 1.0, 3.0]]), 2)
(tensor([[3., 3.]]), tensor([[1, 3]]))
"""

from __future__ import annotations

import torch

from ._top_p import float32, rounds_at_most

__all__ = ["top_candidates", "top_p_candidates", "top_p_count"]

_NEG_INF = float("-inf")


def top_candidates(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` largest scores per row, sorted descending, ties by ascending token id.

    `torch.topk` (a selection, not a sort of the row), then the k winners re-sorted so that equal
    scores come in id order. Which of several tokens tied at the k-th value are returned is
    unspecified, as in `torch.topk`.

    Args:
        scores: `(batch, vocab)` float32.
        k: How many, `1 <= k <= vocab`.

    Returns:
        `(batch, k)` scores and `(batch, k)` int64 token ids.

    >>> top_candidates(torch.tensor([[0.0, 3.0, 1.0, 3.0]]), 3)
    (tensor([[3., 3., 1.]]), tensor([[1, 3, 2]]))
    """
    cand, ids = _block_topk(scores, k)  # [N, k]
    ids, order = ids.sort(dim=-1)
    cand, order = cand.gather(1, order).sort(dim=-1, descending=True, stable=True)
    return cand, ids.gather(1, order)


def _block_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(scores, k)`, found among the `k` blocks of tokens with the largest maxima.

    Every token of the top k lies in a block whose maximum is at least the k-th value, and at most
    k blocks have such a maximum (ties aside), so the best k blocks hold the answer: one read of
    the row for the block maxima, then `torch.topk` on `k * block` values instead of the vocabulary
    (`torch.topk` over a whole row costs 5-35 reads of it on CPU). Data-dependent (CPU eager only):
    a row with fewer than k scores above -inf among those blocks goes through `torch.topk` itself.
    """
    vocab = scores.shape[-1]
    block = min(32, 1 << max(vocab // (4 * k), 1).bit_length() - 1)  # a power of two, k * block <= vocab / 4
    if block < 4 or vocab < 2048 or not scores.is_contiguous():
        return tuple(torch.topk(scores, k, dim=-1))  # type: ignore[return-value]
    full = vocab // block  # whole blocks; a last partial one is padded with -inf
    maxima = scores[:, : full * block].unflatten(1, (full, block)).amax(dim=-1)  # [N, NB]
    if full * block < vocab:
        maxima = torch.cat([maxima, scores[:, full * block:].amax(dim=-1, keepdim=True)], dim=-1)
    blocks = torch.topk(maxima, k, dim=-1, sorted=False).indices  # [N, k]
    ids = (blocks[:, :, None] * block + torch.arange(block, device=scores.device)).flatten(1)  # [N, k * block]
    outside = ids >= vocab
    values = scores.gather(1, ids.clamp_(max=vocab - 1)).masked_fill_(outside, _NEG_INF)
    cand, local = torch.topk(values, k, dim=-1)  # [N, k], sorted
    if bool((cand[:, -1] == _NEG_INF).any()):  # padding could stand in for a real -inf token
        return torch.topk(scores, k, dim=-1)
    return cand, ids.gather(1, local)


_CANDIDATES = (64, 512)  # top-p candidate counts tried on CPU before the radix select


def top_p_candidates(scores: torch.Tensor, probs: torch.Tensor, top_p: float, at_least: int,
                     memo: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """HF's top-p cut among the best-scoring candidates, when a check proves they hold it; else None.

    Tries 64, then 512 candidates (CPU eager: each try reads one flag). With a `memo` kept between
    steps, a size too small for the last step is not tried (successive steps look alike). That
    never changes the outcome: a smaller size that succeeds implies that the larger one does.

    Args:
        scores: `(batch, vocab)` float32 scores, temperature applied.
        probs: `(batch, vocab)` their softmax.
        top_p, at_least: `TopPLogitsWarper`'s `top_p` and `min_tokens_to_keep`.
        memo: A dict kept by the caller between steps, or None.

    Returns:
        `(ids, cand, keep)`, each `(batch, K)`: candidate ids and scores (descending) and which
        survive; or None when the candidates cannot prove the cut.
    """
    vocab = scores.shape[-1]
    memo = {} if memo is None else memo
    total = None
    sizes = [k for k in _CANDIDATES if k == _CANDIDATES[0] or 8 * k <= vocab]
    last = memo.get("kept")
    if last is not None:  # successive steps look alike: start where the last one ended
        sizes = [k for k in sizes if 4 * k > 5 * last] or sizes[-1:]
    for k in sizes:
        k = min(k, vocab)
        if at_least >= k:
            break
        cand, ids = top_candidates(scores, k)  # [N, K]
        picked = probs.gather(1, ids)  # [N, K]
        rest = torch.zeros_like(picked[:, :1], dtype=torch.float64)  # [N, 1] mass of the other tokens
        if k < vocab:
            if total is None:
                # [N, 1] 1 up to rounding; summed in float64, as HF's cumsum accumulates, so that the mass
                # below the candidates rounds to HF's side of the cut even when probabilities tie on it
                total = probs.sum(dim=-1, keepdim=True, dtype=torch.float64)
            rest = (total - picked.double().sum(dim=-1, keepdim=True)).clamp_(min=0)
        kept = top_p_count(picked, rest, top_p, at_least)
        # Certain only if the last kept candidate is above every token that is not a candidate.
        cut = cand.gather(1, kept - 1)  # [N, 1]
        if k == vocab or bool(((kept < k) & (cut > cand[:, -1:])).all()):
            memo["kept"] = int(kept.max())
            return ids, cand, torch.arange(k, device=cand.device) < kept
        # A larger try can only succeed if its extra tokens, none above the k-th, could reach top_p.
        reach = picked.double().sum(dim=-1) + (_CANDIDATES[-1] - k) * picked[:, -1].double()
        if k == vocab or not bool((reach > top_p).all()):
            break
    memo["kept"] = None
    return None


def top_p_count(probs: torch.Tensor, rest: torch.Tensor, top_p: float, at_least: int) -> torch.Tensor:
    """`(batch, 1)` how many of the `probs` (in descending score order) HF's top-p keeps.

    HF's cumulative probability at position j is the mass at or below it: `rest` (float64, the
    tokens below every candidate) plus `probs[j:]`, summed from the smallest up as HF's ascending
    `cumsum` does, so that a tail of tiny probabilities keeps its precision. A position is kept if
    that, rounded to float32, is `> 1 - top_p`; the first `at_least` always are.

    >>> top_p_count(torch.tensor([[0.5, 0.3, 0.2]]), torch.zeros(1, 1, dtype=torch.float64), 0.7, 1).tolist()
    [[2]]
    """
    cumulative = probs.double().flip(-1).cumsum(dim=-1).flip(-1) + rest  # [N, K]
    cut, inclusive = rounds_at_most(float32(1.0 - top_p))
    kept = (cumulative > cut if inclusive else cumulative >= cut).sum(dim=-1, keepdim=True)
    return kept.clamp_(min=min(at_least, probs.shape[-1]))
