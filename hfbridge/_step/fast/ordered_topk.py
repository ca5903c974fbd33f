"""The `k` best scores of each row in the order HF's top-p sees them, on fixed shapes.

The compiled top-p route (`_step/fast/top_p/compiled.py`) needs its candidates best first, equal scores by
ascending token id. A sort does that, but on CPU `torch.sort` and a float `torch.topk` cost more
than the rest of the search: here each value and its id are packed into one int64 key (the score's
bits, made to order as signed integers, above the complement of the id), so that one `torch.topk`
of the keys returns them in that order. The values come from the rows' best blocks of 8 tokens
(block maxima; for large vocabularies from within the best blocks of 32), so that the keys number
`8 k`, not the vocabulary.

>>> ordered_topk(torch.tensor([[0.0, 3.0, 1.0, 3.0]]), 3)
(tensor([[3., 3., 1.]]), tensor([[1, 3, 2]]), tensor([[3.]]))
"""

from __future__ import annotations

import torch

from hfbridge._step.fast.candidates import top_blocks

__all__ = ["ordered_topk"]

_BLOCK = 8  # tokens per block: one 32-byte read of the row per block chosen
_GROUP = 4  # blocks per group in the first level of large vocabularies
_LOW = (1 << 32) - 1  # the id's complement fills the key's low 32 bits


def ordered_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `k` largest scores of each row, best first, equal scores by ascending id; fixed shapes.

    Which of several tokens tied at the k-th value are returned is unspecified, as in
    `torch.topk`; every token left out scores at most the k-th value returned. `-0.0` counts as `0.0`.
    A row holding NaN gets some NaN first (such a row has no distribution).

    Args:
        scores: `(batch, vocab)` float32, `vocab < 2**32`.
        k: How many, `1 <= k <= vocab`.

    Returns:
        `(batch, k)` scores, `(batch, k)` int64 token ids, and `(batch, 1)` each row's maximum
        (`scores.amax(-1)`, here from the block maxima: no other read of the row). With a vocabulary that is not a
        multiple of 8, a row with fewer than `k` scores above `-inf` in its best blocks may get
        `-inf` entries whose id repeats another's (the last token's); every id is in range.

    >>> ordered_topk(torch.tensor([[2.0, -1.0, 2.0, 5.0]]), 4)[1].tolist()
    [[3, 0, 2, 1]]
    """
    n, vocab = scores.shape
    if vocab < 2 * _BLOCK * k:  # the whole row
        values = scores.contiguous()
        ids = torch.arange(vocab, device=scores.device).expand(n, vocab)
        best = scores.amax(dim=-1, keepdim=True)
    else:
        values, ids, best = _best_blocks(scores, k)  # [N, 8k]
    values = torch.where(values == 0, 0.0, values)  # -0.0 as 0.0: one key for equal scores
    bits = values.view(torch.int32).long()  # [N, M] sign-extended
    key = ((bits ^ ((bits >> 31) & 0x7FFFFFFF)) << 32) | (_LOW - ids)  # orders as (score, -id)
    local = torch.topk(key, k, dim=-1).indices  # [N, k] best first
    return values.gather(1, local), ids.gather(1, local), best


def _best_blocks(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(batch, 8k)` scores and ids of the `k` blocks of 8 tokens with the largest maxima (they
    hold the k best scores). Above `8 * 8k` tokens, from the k best blocks of 32 tokens: their
    maxima cost one read of the row as cheap as the row's maximum (inductor, CPU), where blocks of
    8 cost twice that; the blocks of 8 are then picked among the `4k` inside them."""
    vocab = scores.shape[-1]
    if -(-vocab // _BLOCK) <= _BLOCK * k:
        values, ids, maxima = top_blocks(scores, k, _BLOCK)  # [N, 8k]
        return values, ids, maxima.amax(dim=-1, keepdim=True)  # the row's maximum from the block maxima
    values, ids, maxima = top_blocks(scores, k, _BLOCK * _GROUP)  # [N, 32k]
    best = maxima.amax(dim=-1, keepdim=True)  # [N, 1]
    inner = values.unflatten(1, (-1, _BLOCK)).amax(dim=-1)  # [N, 4k] maxima of the blocks of 8 inside
    inside = torch.topk(inner, k, dim=-1, sorted=False).indices  # [N, k] blocks of 8 inside those of 32
    local = (inside[:, :, None] * _BLOCK + torch.arange(_BLOCK, device=scores.device)).flatten(1)  # [N, 8k]
    return values.gather(1, local), ids.gather(1, local), best
