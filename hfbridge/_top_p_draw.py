"""HF's top-p draw when many tokens survive, without finding the cut: draw, then check the token.

When tens of thousands of tokens survive top-p (flat rows, temperature 1), no small candidate set
holds the cut, and finding it exactly over the vocabulary (`_top_p.py`'s radix select) costs tens
of reads of the row. Sampling does not need the cut, only HF's distribution: the softmax restricted
to the tokens HF keeps. `draw_top_p` draws from the whole softmax and accepts the token if HF
keeps it, else draws that row again (rejection sampling: the accepted token has exactly the
restricted distribution; about `1 / top_p` draws per row on average).

Whether HF keeps a token is read from the candidates already tried (`TopPTry`): the best-scoring
ones that surely survive are accepted at once (most of the mass), and where a row's candidates
decide its cut, every other token is refused. Any other token is checked exactly: HF's running
sum at its place in the ascending order is the float64 mass of the lower scores plus its own tie
group, compared with `1 - top_p` as `top_p_count` does. CPU eager only (reads flags).

>>> import torch
>>> from hfbridge._candidates import top_p_candidates
>>> scores = torch.randn(2, 5000, generator=torch.Generator().manual_seed(0))
>>> probs = torch.softmax(scores, dim=-1)
>>> tried = top_p_candidates(scores, probs, 0.9, 1)
>>> tried.proved
False
>>> tokens, valid = draw_top_p(scores, probs, tried, 0.9, 1, torch.Generator().manual_seed(0))
>>> tokens.shape, bool(valid.all())
(torch.Size([2]), True)
"""

from __future__ import annotations

import torch

from ._candidates import TopPTry, certified_total
from ._draw import draw, pick
from ._top_p import float32, rounds_at_most, top_p_mask

__all__ = ["draw_top_p"]

_ROUNDS = 32  # draws per row before the rows still refused take the radix select
_MIN_TOP_P = 0.5  # below, rows draw again too often (about 1 / top_p draws per row): the radix select
_CHUNK = 1 << 20  # elements of the rows checked at once (their copies stay a fraction of the logits)


def draw_top_p(scores: torch.Tensor, probs: torch.Tensor, tried: TopPTry, top_p: float, at_least: int,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One token per row from HF's top-p distribution, by rejection; None where it does not apply.

    Args:
        scores: `(batch, vocab)` float32 scores, temperature applied (they order HF's sort).
        probs: `(batch, vocab)` their softmax.
        tried: The candidates `top_p_candidates` tried last (the best scores of each row).
        top_p, at_least: `TopPLogitsWarper`'s `top_p` and `min_tokens_to_keep`.
        generator: Seeds the draws. Default: torch's global generator.

    Returns:
        `(batch,)` int64 tokens and `(batch,)` bool validity (all True), or None when a row has no
        distribution (NaN, `+inf` or only `-inf` scores), `at_least` reaches past the candidates
        that surely survive, or `top_p < 0.5`: the caller then finds the cut over the whole row.
    """
    n, vocab = probs.shape
    if top_p < _MIN_TOP_P:
        return None
    surely = tried.surely_kept()  # [N, K]
    # The sums also tell a row without a distribution: its softmax is NaN.
    if not bool(((surely.sum(dim=-1) >= at_least) & (tried.picked[:, 0] > 0)).all()):
        return None
    cut, inclusive = rounds_at_most(float32(1.0 - top_p))
    decided = tried.decided().squeeze(1)  # [N] rows whose candidates hold the cut
    partial = None if tried.total is None else tried.total.partial
    tokens = draw(probs, generator) if partial is None else _draw_by_partial_sums(probs, partial, generator)  # [N]
    rows = torch.arange(n, device=probs.device)
    for _ in range(_ROUNDS):
        token = tokens[rows]  # [R]
        accept = ((tried.ids[rows] == token[:, None]) & surely[rows]).any(dim=-1)  # [R]
        check = ~accept & ~decided[rows]  # a decided row refuses every token it did not keep
        if bool(check.any()):
            checked, kept = rows[check], []
            step = max(1, _CHUNK // vocab)
            for start in range(0, checked.numel(), step):
                part = checked[start : start + step]
                # scores[part] and probs[part] are copies: `_kept_exactly` writes to them
                kept.append(_kept_exactly(scores[part], probs[part], tokens[part], cut, inclusive))
            accept[check] = torch.cat(kept)
        rows = rows[~accept]
        if rows.numel() == 0:
            return tokens, torch.ones(n, dtype=torch.bool, device=probs.device)
        tokens[rows] = draw(probs[rows], generator)
    # Rows refused this often keep little mass in reach: find their cut over the whole row.
    keep = top_p_mask(probs[rows], top_p, at_least, scores=scores[rows], branch=True)
    tokens[rows] = draw(probs[rows].masked_fill_(~keep, 0.0), generator)
    return tokens, torch.ones(n, dtype=torch.bool, device=probs.device)


def _draw_by_partial_sums(probs: torch.Tensor, partial: torch.Tensor,
                          generator: torch.Generator | None) -> torch.Tensor:
    """`draw(probs)` in three levels, reusing the sums of 16 tokens that `certified_total` made:
    a group of 32 such sums, then one sum, then a token. `(batch,)` int64."""
    n, sums = partial.shape
    width = -sums % _GROUP
    padded = torch.nn.functional.pad(partial, (0, width)) if width else partial  # [N, G * 32]
    group, _ = pick(padded.view(n, -1, _GROUP).sum(dim=-1), generator)  # [N]
    slots = group[:, None] * _GROUP + torch.arange(_GROUP, device=probs.device)  # [N, 32]
    block = slots.gather(1, pick(padded.gather(1, slots), generator)[0][:, None])  # [N, 1]
    ids = block * _PARTIAL + torch.arange(_PARTIAL, device=probs.device)  # [N, 16]
    return ids.gather(1, pick(probs.gather(1, ids), generator)[0][:, None]).squeeze(1)


_GROUP = 32  # partial sums per group in `_draw_by_partial_sums`
_PARTIAL = 16  # tokens per partial sum (`certified_total`)


def _kept_exactly(scores: torch.Tensor, probs: torch.Tensor, token: torch.Tensor, cut: float,
                  inclusive: bool) -> torch.Tensor:
    """`(rows,)` bool: does HF's top-p keep `token` (`(rows,)` ids) in each of these rows?

    HF sorts ascending by score and keeps a token whose running sum of probabilities (float64
    accumulation, rounded to float32) is above `1 - top_p`. The running sum at a token is the mass
    of the lower scores plus its own place among equal scores: of those, the fast path keeps the
    lowest ids (`keep_highest`), so they come last in the ascending order.

    Args:
        scores, probs: `(rows, vocab)` private copies (modified).
        token: `(rows,)` int64.
        cut, inclusive: `rounds_at_most(float32(1 - top_p))`.
    """
    column = token[:, None]  # [R, 1]
    score = scores.gather(1, column)  # [R, 1]
    own = probs.gather(1, column).double()  # [R, 1]
    lower = scores < score  # [R, V]
    below_approx, slack, _ = certified_total(probs.mul_(lower))  # mass of the lower scores, within slack
    place = torch.ones_like(own)  # [R, 1] 1 + equal scores at higher ids
    scores.scatter_(1, column, float("nan"))  # the token itself is not its own tie
    tied = (scores == score).any(dim=-1)  # [R]
    if bool(tied.any()):
        ids = torch.arange(scores.shape[-1], device=scores.device)
        place[tied] += ((scores[tied] == score[tied]) & (ids > column[tied])).sum(dim=-1, keepdim=True).double()
    low = below_approx - slack + own * place
    high = below_approx + slack + own * place
    kept = low > cut if inclusive else low >= cut
    refused = ~(high > cut if inclusive else high >= cut)
    open_ = ~kept & ~refused
    if bool(open_.any()):  # the slack straddles the cut: the exact float64 mass of the lower scores
        below = probs[open_.squeeze(1)].sum(dim=-1, keepdim=True, dtype=torch.float64)
        running = below + own[open_.squeeze(1)] * place[open_.squeeze(1)]
        kept[open_.squeeze(1)] = running > cut if inclusive else running >= cut
    return kept.squeeze(1)
