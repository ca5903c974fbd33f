"""The fast path's draw: one token per row from unnormalised weights, without `torch.multinomial`.

Each pick inverts a float64 running sum with one uniform number (`pick`; `draw_one_row` is the
same arithmetic on NumPy views for a single CPU row, where torch's per-op cost would dominate).
A row whose weights hold NaN or add up to nothing (the softmax of a row with NaN, `+inf` or only
`-inf` scores is all NaN) gets an in-range token and a False in the validity flag that comes with
the tokens: the caller raises on it, where it reads the device anyway (see `Sampler.check_rows`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading

import numpy as np
import torch

__all__ = ["draw", "draw_checked", "draw_kept", "draw_one_row", "draw_one_row_known", "host_view", "pick"]


def draw(weights: torch.Tensor, generator: torch.Generator | None = None, block: int | None = None) -> torch.Tensor:
    """One token per row with probability `weights / weights.sum(-1)`, without `torch.multinomial`.

    Two levels: a block of `block` tokens is picked by its summed weight, then a token inside it by
    its weight. Each pick inverts a float64 running sum with one uniform number, so a row needs two
    random numbers and no pass over the vocabulary besides the block sums; the result has exactly
    the distribution `weights / weights.sum(-1)` (to float64 rounding).

    Args:
        weights: `(batch, vocab)` non-negative float weights, unnormalised; each row needs one > 0.
        generator: Seeds the draw; on the device of `weights`. Default: torch's global generator.
        block: Tokens per block. Default: the power of two nearest `sqrt(vocab)`.

    Returns:
        `(batch,)` int64 token ids.

    >>> draw(torch.tensor([[0.0, 1.0, 0.0]]), torch.Generator().manual_seed(0)).tolist()
    [1]
    """
    return draw_checked(weights, generator, block)[0]


def draw_checked(weights: torch.Tensor, generator: torch.Generator | None = None, block: int | None = None, *,
                 uniforms: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`draw`, plus a `(batch,)` bool flag: False for a row whose weights are NaN or all zero.

    Such a row still gets a token id in range (never an out-of-bounds index on any device).
    `uniforms`: the two `(batch, 1)` float64 numbers each `pick` would draw, drawn by the caller
    (inside `torch.cond` nothing is drawn); by default drawn here, in that order.

    >>> tokens, valid = draw_checked(torch.tensor([[0.0, 2.0], [float("nan"), 1.0]]))
    >>> valid.tolist()
    [True, False]
    """
    n, vocab = weights.shape
    if block is None:
        block = 1 << round(math.log2(max(vocab, 1)) / 2)
    weights = weights.contiguous()
    full = vocab // block * block
    sums = weights.as_strided((n, full // block, block), (vocab, block, 1)).sum(dim=-1)  # [N, NB]
    if full < vocab:
        sums = torch.cat([sums, weights[:, full:].sum(dim=-1, keepdim=True)], dim=-1)
    first, second = (None, None) if uniforms is None else uniforms
    chosen, valid = pick(sums, generator, uniform=first)
    ids = chosen[:, None] * block + torch.arange(block, device=weights.device)  # [N, B]
    inside = ids < vocab
    ids = ids.clamp_(max=vocab - 1)
    local = weights.gather(1, ids).mul_(inside)  # [N, B]
    return ids.gather(1, pick(local, generator, uniform=second)[0][:, None]).squeeze(1), valid


def pick(weights: torch.Tensor, generator: torch.Generator | None = None, *,
         uniform: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`(batch,)` index i with probability `w_i / sum(w)`, and `(batch,)` bool: the row could be drawn.

    The index is the first running sum above `U * sum(w)`; a row with NaN or no weight gets an
    index in range and False. `uniform`: `(batch, 1)` float64 U in [0, 1) drawn by the caller;
    by default drawn here (`torch.rand`).

    >>> pick(torch.tensor([[0.0, 0.0, 3.0]]))[0].tolist()
    [2]
    """
    running = weights.double().cumsum(dim=-1)  # [N, K]
    total = running[:, -1:]  # [N, 1]
    if uniform is None:
        uniform = torch.rand(total.shape, generator=generator, device=weights.device, dtype=torch.float64)
    # U < 1 but U * total may round up to total; stay strictly below so a zero weight is never picked.
    target = torch.minimum(uniform * total, total * (1 - 2.0**-52))
    index = (running <= target).sum(dim=-1).clamp_(max=weights.shape[-1] - 1)
    return index, (total > 0).squeeze(1)  # NaN > 0 is False


def draw_one_row(ids: torch.Tensor, cand: torch.Tensor, keep: torch.Tensor,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token from one CPU row of candidates: `pick` over `exp(cand - cand[0])` where `keep`.

    The same weights (torch's `exp`), the same uniform number and the same float64 running sum as
    `pick`, so the token is the one a batch would draw for this row; the small steps run on NumPy
    views. Host reads are free here: the candidates exist only on the CPU route.

    Args:
        ids: `(1, K)` int64 candidate token ids.
        cand: `(1, K)` float32 their scores, the best first.
        keep: `(1, K)` bool, which candidates survive.
        generator: Seeds the draw (CPU). Default: torch's global generator.

    Returns:
        `(1,)` int64 token id and `(1,)` bool: False for a row whose weights are NaN or all zero.

    >>> tokens, valid = draw_one_row(torch.tensor([[7, 3]]), torch.tensor([[2.0, 1.0]]), torch.tensor([[False, True]]))
    >>> tokens.tolist(), valid.tolist()
    ([3], [True])
    """
    token, valid = draw_one_row_known(ids, cand, keep, generator)
    return token, torch.tensor([valid])


def draw_one_row_known(ids: torch.Tensor, cand: torch.Tensor, keep: torch.Tensor | None,
                       generator: torch.Generator | None = None) -> tuple[torch.Tensor, bool]:
    """`draw_one_row` with the validity as a Python bool: the caller reads it without a torch op.
    `keep=None`: every candidate survives (the one-row top-p's answer), nothing to mask.

    >>> draw_one_row_known(torch.tensor([[7, 3]]), torch.tensor([[float("nan"), 1.0]]), torch.tensor([[True, True]]))
    (tensor([7]), False)
    """
    return draw_kept(ids.numpy()[0], host_view(cand)[0], None if keep is None else keep.numpy()[0], generator)


def draw_kept(ids: np.ndarray, scores: np.ndarray, keep: np.ndarray | int | None,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, bool]:
    """`draw_one_row_known` on NumPy arrays: `(K,)` int64 ids, `(K,)` float32 scores (the best first)
    and `(K,)` bool `keep`, or how many of the first survive (an int), or None (all kept).

    >>> draw_kept(np.array([7, 3]), np.array([1.0, 1.0], dtype=np.float32), np.array([False, True]))
    (tensor([3]), True)
    """
    uniform = _uniform(generator)
    if not math.isfinite(scores[0]):  # NaN, +inf or only -inf
        return torch.from_numpy(ids[:1].copy()), False  # `pick`'s token for a row without a distribution
    weights = scores - scores[0]  # [K] float32
    torch.from_numpy(weights).exp_()  # torch's exp, as `pick`'s callers, in place
    if isinstance(keep, int):  # a prefix survives
        weights[keep:] *= 0.0  # the removed tokens' weights, 0 (NaN stays NaN, as in `pick`'s masked weights)
    elif keep is not None:
        weights *= keep  # a removed token's weight is 0 (NaN stays NaN, as in `pick`)
    # `pick`'s float64 running sum, added in the same order, on Python floats (few: no NumPy call is cheaper)
    running = list(itertools.accumulate(weights.tolist()))  # [K]
    total = running[-1]
    if not total > 0:  # NaN weights, or none kept
        return torch.from_numpy(ids[:1].copy()), False
    target = min(uniform * total, total * (1 - 2.0**-52))
    index = min(bisect.bisect_right(running, target), len(running) - 1)  # the first running sum above target
    return torch.from_numpy(ids[index:index + 1].copy()), True


_BUFFERS = threading.local()  # a float64 scalar per thread for `_uniform`


def _uniform(generator: torch.Generator | None) -> float:
    """`torch.rand((1, 1), generator=generator, dtype=torch.float64).item()` (`pick`'s number, the same
    draw from the generator), into a buffer kept by the thread: one dispatched op instead of three."""
    held = getattr(_BUFFERS, "uniform", None)
    if held is None:
        with torch.inference_mode(False):  # a normal tensor: written in place in and out of inference mode
            buffer = torch.empty(1, dtype=torch.float64)
        held = _BUFFERS.uniform = (buffer, buffer.numpy())
    held[0].uniform_(generator=generator)
    return float(held[1][0])  # read through NumPy's view: no dispatched `item`


def host_view(values: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values as a NumPy view (no copy), also for a tensor that requires grad.

    `numpy(force=True)` would run four dispatched ops (detach, cpu, resolve_conj, resolve_neg)
    on every call, costly once a step's large ops have evicted their code from the caches.

    >>> host_view(torch.ones(2, requires_grad=True)).tolist()
    [1.0, 1.0]
    """
    return (values.detach() if values.requires_grad else values).numpy()
