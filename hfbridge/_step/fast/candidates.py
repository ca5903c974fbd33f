"""HF's top-p cut among the best-scoring tokens, when a check proves they hold it.

`top_candidates` selects the best `k` scores with `torch.topk` (a selection, not a sort of the
row); `top_p_count` finds HF's cut among them; `top_p_candidates` tries growing `k` and declines
(returns None) when the candidates cannot prove the cut, leaving it to the radix select of
`_step/fast/top_p/mask.py`. CPU eager only: each try reads one flag.

>>> top_candidates(torch.tensor([[0.0, 3.0, 1.0, 3.0]]), 2)
(tensor([[3., 3.]]), tensor([[1, 3]]))
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hfbridge._step.fast.top_p.floor_candidates import candidates_above, next_floor
from hfbridge._step.fast.top_p.mask import TopP, removal_cut, survives, top_p_rows

__all__ = ["TopPTry", "Total", "block_topk", "candidates_cannot_hold", "certified_total", "proved_last",
           "top_blocks", "top_candidates", "top_p_candidates", "top_p_count"]

_NEG_INF = float("-inf")


def top_candidates(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` largest scores per row, sorted descending, ties by ascending token id.

    `torch.topk` (a selection, not a sort of the row; at large vocabularies through group maxima),
    then, if some of the k winners have equal scores, re-sorted so that those come in id order.
    Which of several tokens tied at the k-th value are returned is unspecified, as in `torch.topk`.
    CPU eager (reads one flag).

    Args:
        scores: `(batch, vocab)` float32.
        k: How many, `1 <= k <= vocab`.

    Returns:
        `(batch, k)` scores and `(batch, k)` int64 token ids.

    >>> top_candidates(torch.tensor([[0.0, 3.0, 1.0, 3.0]]), 3)
    (tensor([[3., 3., 1.]]), tensor([[1, 3, 2]]))
    """
    vocab = scores.shape[-1]
    if vocab >= 64 * max(k, 64) and scores.stride(-1) == 1:
        cand, ids = _grouped_topk(scores, k)  # [N, k]
    else:
        cand, ids = _block_topk(scores, k)
    if not bool((cand[:, 1:] == cand[:, :-1]).any()):
        return cand, ids  # no equal scores: nothing to put in id order
    ids, order = ids.sort(dim=-1)
    cand, order = cand.gather(1, order).sort(dim=-1, descending=True, stable=True)
    return cand, ids.gather(1, order)


def _block_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`block_topk`, or `torch.topk` itself where a data-dependent check says so (CPU eager only):
    for rows that are not contiguous, and when the padding of a partial last block could stand in
    for a real `-inf` token (a row with fewer than k scores above -inf in those blocks)."""
    if not scores.is_contiguous():
        return tuple(torch.topk(scores, k, dim=-1))  # type: ignore[return-value]
    cand, ids = block_topk(scores, k)
    if bool((cand[:, -1] == _NEG_INF).any()):
        return tuple(torch.topk(scores, k, dim=-1))  # type: ignore[return-value]
    return cand, ids


def block_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` largest scores per row and their ids, from the `k` blocks with the largest maxima.

    One read of the row for the block maxima, then `torch.topk` on `k * block` values instead of the
    vocabulary. Fixed shapes: a row with fewer than `k` scores above `-inf` in those blocks may get
    `-inf` entries for the padding of a partial last block; their ids are in range.

    >>> block_topk(torch.tensor([[0.0, 3.0, 1.0, 3.0]]), 2)
    (tensor([[3., 3.]]), tensor([[1, 3]]))
    """
    vocab = scores.shape[-1]
    block = min(32, 1 << max(vocab // (4 * k), 1).bit_length() - 1)  # a power of two, k * block <= vocab / 4
    if block < 4 or vocab < 2048:
        return tuple(torch.topk(scores, k, dim=-1))  # type: ignore[return-value]
    values, ids, _ = top_blocks(scores, k, block)  # [N, k * block]
    cand, local = torch.topk(values, k, dim=-1)  # [N, k]
    return cand, ids.gather(1, local)


def top_blocks(scores: torch.Tensor, k: int, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(batch, k * block)` scores and ids of the `k` blocks of `block` tokens with the largest maxima
    (a partial last block is padded with `-inf` at the last token's id), and `(batch, blocks)` the
    block maxima themselves. Fixed shapes: `block_topk` and the compiled route's ordered top-k.

    >>> values, ids, maxima = top_blocks(torch.tensor([[0.0, 3.0, 1.0, 4.0, 2.0]]), 1, 2)
    >>> values.tolist(), ids.tolist(), maxima.tolist()
    ([[1.0, 4.0]], [[2, 3]], [[3.0, 4.0, 2.0]])
    """
    vocab = scores.shape[-1]
    full = vocab // block  # whole blocks; a last partial one is padded with -inf
    maxima = scores[:, : full * block].unflatten(1, (full, block)).amax(dim=-1)  # [N, NB]
    if full * block < vocab:
        maxima = torch.cat([maxima, scores[:, full * block:].amax(dim=-1, keepdim=True)], dim=-1)
    blocks = torch.topk(maxima, k, dim=-1, sorted=False).indices  # [N, k]
    ids = (blocks[:, :, None] * block + torch.arange(block, device=scores.device)).flatten(1)  # [N, k * block]
    outside = ids >= vocab
    ids = ids.clamp(max=vocab - 1)
    return scores.gather(1, ids).masked_fill_(outside, _NEG_INF), ids, maxima


_GROUP = 8  # tokens per group at each of the two levels of `_grouped_topk`


def _grouped_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(scores, k)` through two levels of group maxima: three small `torch.topk`s.

    A group is 8 tokens one eighth of the row apart (`i, i + V/8, ...`), so its maximum reduces an
    outer dimension (vectorised: cheaper than one `amax` of the row); eight groups make a supergroup
    the same way. The top k tokens lie in the k groups with the largest maxima, and those in the k
    supergroups with the largest maxima (ties aside, where some of the tied values are as good as
    others): so `torch.topk` runs on `8k` group maxima and then on `8k` scores instead of the row.
    The last `V mod 64` tokens are always candidates. Needs `V >= 64 k`.
    """
    n, vocab = scores.shape
    full = vocab - vocab % (_GROUP * _GROUP)
    groups, supers = full // _GROUP, full // (_GROUP * _GROUP)
    spread = torch.arange(_GROUP, device=scores.device)  # [8]
    maxima = scores[:, :full].view(n, _GROUP, groups).amax(dim=1)  # [N, V/8]; group g holds g + j * V/8
    top = torch.topk(maxima.view(n, _GROUP, supers).amax(dim=1), k, dim=-1, sorted=False).indices  # [N, k]
    group_ids = (top[:, :, None] + spread * supers).flatten(1)  # [N, 8k] the groups of those supergroups
    best = torch.topk(maxima.gather(1, group_ids), k, dim=-1, sorted=False).indices
    ids = (group_ids.gather(1, best)[:, :, None] + spread * groups).flatten(1)  # [N, 8k] their tokens
    if full < vocab:
        tail = torch.arange(full, vocab, device=scores.device).expand(n, -1)
        ids = torch.cat([ids, tail], dim=1)
    cand, local = torch.topk(scores.gather(1, ids), k, dim=-1)  # [N, k], sorted
    return cand, ids.gather(1, local)


_CANDIDATES = (64, 512)  # top-p candidate counts tried on CPU before the radix select


class TopPTry(NamedTuple):
    """The last candidate set `top_p_candidates` tried, each `(batch, K)`, scores descending.

    `kept[r]` candidates of row r survive HF's top-p, counted with the exact float64 total; when
    `proved`, no other token of any row does. When not, `kept` still says which candidates surely
    survive: those above the K-th score (a non-candidate may tie with it) among the first `kept`.
    """

    ids: torch.Tensor  # [N, K] int64
    cand: torch.Tensor  # [N, K] float32 scores, descending
    picked: torch.Tensor  # [N, K] float32 probabilities
    kept: torch.Tensor  # [N, 1] int64
    proved: bool
    total: Total | None  # the probabilities' certified total (None when K is the vocabulary)

    def keep(self) -> torch.Tensor:
        """`(batch, K)` bool: the candidates that survive (all that do, when `proved`)."""
        return torch.arange(self.ids.shape[1], device=self.ids.device) < self.kept

    def surely_kept(self) -> torch.Tensor:
        """`(batch, K)` bool: candidates that survive whatever the tokens outside the set."""
        return self.keep() & (self.cand > self.cand[:, -1:])

    def decided(self) -> torch.Tensor:
        """`(batch, 1)` bool: rows where no token outside the candidates survives; never a row whose total is
        NaN (a NaN or `+inf` score, which candidates chosen by comparison may leave out): its draw flags it."""
        decided = (self.kept < self.ids.shape[1]) & (self.cand.gather(1, self.kept - 1) > self.cand[:, -1:])
        return decided if self.total is None else decided & ~self.total.approx.isnan()


def _sizes(vocab: int, last: int | None) -> list[int]:
    """Candidate counts to try: 64, then 512 (if the vocabulary has 8 times that). After a step
    that kept `last` tokens at most, first the multiple of 64 a quarter above `last`, if smaller
    than the largest size, then the largest size.

    >>> _sizes(128256, None), _sizes(128256, 30), _sizes(128256, 273), _sizes(128256, 513), _sizes(3000, 273)
    ([64, 512], [64, 512], [384, 512], [512], [64])
    """
    sizes = [k for k in _CANDIDATES if k == _CANDIDATES[0] or 8 * k <= vocab]
    if last is None:
        return sizes
    fit = max(_CANDIDATES[0], -(-5 * last // (4 * _CANDIDATES[0])) * _CANDIDATES[0])  # 1.25 last, up to 64s
    return [fit, sizes[-1]] if fit < sizes[-1] else sizes[-1:]


def top_p_candidates(scores: torch.Tensor, probs: torch.Tensor, top_p: TopP, at_least: int,
                     memo: dict | None = None, total: Total | None = None, *, partial: bool = False) -> TopPTry | None:
    """HF's top-p cut among the best-scoring candidates, and whether a check proves they hold it.

    Tries 64, then 512 candidates (CPU eager: each try reads one flag). With a `memo` kept between
    steps (successive steps look alike), first the tokens above a floor under the last step's cut
    (`_step/fast/top_p/floor_candidates.py`) when that step kept more than 64, and the first size tried is a
    quarter above the last step's count (a try costs more the more candidates it selects;
    `_sizes`). That never changes the outcome: every candidate set that succeeds finds the same
    cut, and the draw over the kept candidates does not depend on how many others were tried.

    Args:
        scores: `(batch, vocab)` float32 scores, temperature applied.
        probs: `(batch, vocab)` their softmax.
        top_p, at_least: `TopPLogitsWarper`'s `top_p` (or `(batch, 1)` float64, one per row) and
            `min_tokens_to_keep`.
        memo: A dict kept by the caller between steps, or None.
        total: `certified_total(probs)` when the caller has it. Default: computed here if needed.
        partial: The caller draws with a check where the candidates do not hold the cut
            (`draw_then_check.py`): the floor's candidates are enough when they hold the cut of
            three rows in four (rows of distinct values, some keeping thousands of tokens).

    Returns:
        The last try (`TopPTry`): `proved` when the candidates hold the cut in every row. None
        when no size could be tried (`min_tokens_to_keep` too large).
    """
    vocab = scores.shape[-1]
    memo = {} if memo is None else memo
    floor = memo.pop("floor", None)  # [N] scores under the last step's cuts (`_step/fast/top_p/floor_candidates.py`)
    # Where the last step kept few enough for the smallest try, that try costs no more than the floor's.
    last = memo.get("kept")
    if (floor is not None and last is not None and last > _CANDIDATES[0] and floor.shape[0] == scores.shape[0]
            and scores.device.type == "cpu"):
        found = candidates_above(scores, floor)
        if found is not None:
            cand, ids = found  # [N, K], rows padded with -inf
            # the padding's probabilities 0 (a multiply by the mask's bytes: probabilities are finite or NaN)
            picked = probs.gather(1, ids).mul_((cand != _NEG_INF).view(torch.uint8))  # [N, K]
            total = certified_total(probs) if total is None else total
            kept = _count_with_total(probs, picked, total, top_p, at_least)
            # A padded row holds its cut only if no padding is kept: `decided` compares with -inf.
            floor_try = TopPTry(ids, cand, picked, kept, False, total)
            decided = floor_try.decided()  # [N, 1]
            if bool(decided.all()):
                memo["kept"], memo["floor"], memo["mostly"] = int(kept.max()), next_floor(cand, kept), True
                return floor_try._replace(proved=True)
            if partial and 4 * int(decided.sum()) >= 3 * decided.shape[0]:
                memo["kept"], memo["floor"], memo["mostly"] = int(kept.max()), next_floor(cand, kept), True
                return floor_try
    memo.pop("mostly", None)
    last_try = None
    for k in _sizes(vocab, memo.get("kept")):
        k = min(k, vocab)
        if at_least >= k:
            break
        cand, ids = top_candidates(scores, k)  # [N, K]
        picked = probs.gather(1, ids)  # [N, K]
        if k < vocab:
            if total is None:
                total = certified_total(probs)
            kept = _count_with_total(probs, picked, total, top_p, at_least)
        else:
            kept = top_p_count(picked, torch.zeros_like(picked[:, :1], dtype=torch.float64), top_p, at_least)
        # Certain only if the last kept candidate is above every token that is not a candidate.
        last_try = TopPTry(ids, cand, picked, kept, False, total)
        if k == vocab or bool(last_try.decided().all()):
            memo["kept"], memo["floor"] = int(kept.max()), next_floor(cand, kept)
            return last_try._replace(proved=True)
        # A larger try can only succeed if its extra tokens, none above the k-th, could reach top_p.
        reach = picked.double().sum(dim=-1) + (_CANDIDATES[-1] - k) * picked[:, -1].double()
        if k == vocab or not bool((reach[:, None] > top_p).all()):
            break
    memo["kept"] = None if last_try is None else _CANDIDATES[-1] + 1  # next step: skip the small try
    if partial and last_try is not None:  # next step: the floor under each row's count, most rows decided by it
        memo["floor"] = next_floor(last_try.cand, last_try.kept)
    return last_try


def proved_last(memo: dict | None) -> bool:
    """Whether the last step's candidates (`top_p_candidates` with this `memo`) held every row's cut,
    or the floor's candidates that of most rows (`partial`)."""
    last = None if memo is None else memo.get("kept")
    return last is not None and (last <= _CANDIDATES[-1] or bool(memo and memo.get("mostly")))


def candidates_cannot_hold(total: Total, top_p: TopP, vocab: int, share: float = 0.0) -> bool:
    """True when the largest candidate set `top_p_candidates` would try provably leaves the cut of
    more than `share` of the rows (default: of some row) outside: trying it is wasted for those rows
    (whatever the memo says, as every smaller set fails then too). With a larger `share`, the
    candidates are still tried when most rows may be decided by them (a batch of rows with distinct
    values: the draw then checks the tokens of the other rows only).

    A row's cut lies among its best `k` tokens only if those hold more than `total - cut` (the
    tokens below them add up to at most the removed mass, `cut = 1 - top_p` in float32). They lie
    in at most `k` of the partial sums of `certified_total`, so they hold at most the `k` largest
    of those, which for any `theta` is at most `sum(max(partial - theta, 0)) + k * theta`: no
    selection needed. `theta` near the k-th largest partial sum makes the bound tight; a tenth of
    the average mass the candidates would need is close on Zipf-like rows and on flat ones.

    >>> flat = torch.softmax(torch.randn(2, 100_000, generator=torch.Generator().manual_seed(0)), dim=-1)
    >>> candidates_cannot_hold(certified_total(flat), 0.9, 100_000)
    True
    """
    k = max(k for k in _CANDIDATES if k == _CANDIDATES[0] or 8 * k <= vocab)
    if k >= vocab:
        return False
    cut, _ = removal_cut(top_p)  # one, or [N, 1]
    approx, slack, partial = total
    needed = approx - slack - cut - 1e-6  # [N, 1] float64; 1e-6: room for float64 rounding
    theta = (needed / (10 * k)).clamp_(min=0).float()  # [N, 1]
    excess = (partial - theta).clamp_(min=0).sum(dim=-1, keepdim=True, dtype=torch.float64)  # [N, 1]
    # The exact partial sums exceed the float32 ones by at most `slack` in all, and each float32
    # difference `partial - theta` is below the exact one by at most a relative 2**-24.
    bound = excess * (1 + 2.0**-22) + slack + k * theta.double()  # [N, 1]
    return bool((bound < needed).sum() > share * bound.shape[0])


_BLOCK = 16  # probabilities per float32 partial sum in `certified_total`
# Relative error bound of a float32 sum of _BLOCK non-negative numbers in any order, gamma_15 =
# 15 u / (1 - 15 u) with u = 2**-24, with room for the float64 sum of the partial sums (~1e-12).
_SLACK = 16 * 2.0**-24


class Total(NamedTuple):
    """What `certified_total` returns: the float64 sum of each row lies within `approx +- slack`."""

    approx: torch.Tensor  # [N, 1] float64
    slack: torch.Tensor  # [N, 1] float64
    partial: torch.Tensor  # [N, ceil(V / 16)] float32 sums of 16 tokens each (`certified_total`)


def certified_total(probs: torch.Tensor) -> Total:
    """The sum of each row of `probs` (>= 0), within a rigorous bound of the exact float64 sum.

    The exact float64 sum (`sum(dtype=torch.float64)`) costs about four reads of the row on CPU;
    float32 sums of 16 numbers, added up in float64, cost less than one, and their error has a
    rigorous bound (every term is >= 0). `_count_with_total` recomputes exactly only the rows whose
    count the slack leaves open. With `W = V // 16`, partial sum `g < W` holds the tokens
    `g, g + W, ..., g + 15 W` (one vectorised reduction over an outer dimension, the fastest on
    CPU), and a last one the `V mod 16` tokens after `16 W`, if any; the draw reuses them.

    >>> total = certified_total(torch.full((1, 64), 1 / 64))
    >>> abs(float(total.approx) - 1.0) <= float(total.slack)
    True
    """
    width = probs.shape[-1] // _BLOCK
    partial = probs[:, : _BLOCK * width].unflatten(1, (_BLOCK, width)).sum(dim=1)  # [N, W]
    if _BLOCK * width < probs.shape[-1]:
        partial = torch.cat([partial, probs[:, _BLOCK * width :].sum(dim=-1, keepdim=True)], dim=-1)
    total = partial.sum(dim=-1, keepdim=True, dtype=torch.float64)  # [N, 1]
    # 1e-30: room for arithmetic that flushes subnormal terms to zero
    return Total(total, total * _SLACK + 1e-30, partial)


def _count_with_total(probs: torch.Tensor, picked: torch.Tensor, total: Total, top_p: TopP,
                      at_least: int) -> torch.Tensor:
    """`top_p_count` of the candidates `picked` with the mass below them taken from a certified
    total: the count at both ends of the total's interval, and the exact float64 total (summed as
    HF's cumsum accumulates) for the rows where the two differ."""
    approx, slack, _ = total
    mass = picked.double().sum(dim=-1, keepdim=True)  # [N, 1]
    tail = _tail(picked)  # [N, K] the running sums, computed once for every count below
    cut = removal_cut(top_p)
    low = _count(tail, (approx - slack - mass).clamp_(min=0), cut, at_least)
    high = _count(tail, (approx + slack - mass).clamp_(min=0), cut, at_least)
    open_ = (low != high).squeeze(1)  # [N] bool; the count grows with the mass below the candidates
    if bool(open_.any()):
        rows = open_.nonzero().squeeze(1)
        exact = probs[rows].sum(dim=-1, keepdim=True, dtype=torch.float64)
        low[rows] = top_p_count(picked[rows], (exact - mass[rows]).clamp_(min=0), top_p_rows(top_p, rows), at_least)
    return low


def top_p_count(probs: torch.Tensor, rest: torch.Tensor, top_p: TopP, at_least: int) -> torch.Tensor:
    """`(batch, 1)` how many of the `probs` (in descending score order) HF's top-p keeps.

    HF's cumulative probability at position j is the mass at or below it: `rest` (float64, the
    tokens below every candidate) plus `probs[j:]`, summed from the smallest up as HF's ascending
    `cumsum` does, so that a tail of tiny probabilities keeps its precision. A position is kept if
    that, rounded to float32, is `> 1 - top_p`; the first `at_least` always are. `top_p`: one, or
    `(batch, 1)` float64, one per row.

    >>> top_p_count(torch.tensor([[0.5, 0.3, 0.2]]), torch.zeros(1, 1, dtype=torch.float64), 0.7, 1).tolist()
    [[2]]
    """
    return _count(_tail(probs), rest, removal_cut(top_p), at_least)


def _tail(probs: torch.Tensor) -> torch.Tensor:
    """`(batch, K)` float64: the mass at or below each position, summed from the smallest up."""
    return probs.double().flip(-1).cumsum(dim=-1).flip(-1)


def _count(tail: torch.Tensor, rest: torch.Tensor, cut: tuple, at_least: int) -> torch.Tensor:
    """`top_p_count` from `_tail`'s running sums and `removal_cut`'s `(cut, inclusive)`."""
    kept = survives(tail + rest, *cut).sum(dim=-1, keepdim=True)  # [N, 1]
    return kept.clamp_(min=min(at_least, tail.shape[-1]))
