"""The fast path: HF's sampling distribution without a full sort or `torch.multinomial`.

`fast_sample` walks a `LogitsProcessorList` in order. Processors it knows are replaced by fused
kernels that keep the tokens HF's keep; any other processor is called through HF unchanged, in its
place. Known processors are matched by exact type (a subclass that overrides `__call__` goes
through HF), and their parameters (`filter_value`, `min_tokens_to_keep`, ...) are read from them:

- `TemperatureLogitsWarper`: the same `scores / temperature`, deferred: a top-k right after it
  divides only its candidates (dividing by a positive number keeps the order).
- `TopKLogitsWarper`: HF's threshold, the k-th largest score; ties with it all survive, as in HF.
  The draw then looks at the k candidates only.
- `TopPLogitsWarper`: HF sorts ascending and drops every token whose cumulative probability is
  `<= 1 - top_p` (a float32 comparison), keeping its last `min_tokens_to_keep`. Here the cut is
  found without the sort: among 64 (then 512) candidates, the best scores by `torch.topk`, when a
  check proves they contain it; else by a radix select over the bits of the probabilities.
- `MinPLogitsWarper`: HF's own arithmetic; its softmax is reused for the draw.

The draw inverts a float64 running sum with one uniform number: over the candidates when the last
filter left candidates, otherwise in two levels (block sums, then inside the chosen block). No
`torch.multinomial`, no vocabulary-sized random tensor; reproducible with a `torch.Generator`.

What "the same" means. `fast=True` gives HF's distribution, not HF's random stream: the tokens
differ from `torch.multinomial`'s for the same seed. Surviving scores are bit for bit HF's, and the
renormalised probabilities agree to float rounding. Two places where HF's own result depends on
details it does not specify: (1) when tokens of equal probability straddle a cut (top-p, or
`min_tokens_to_keep`), HF keeps some of them in the order of `torch.sort` / `torch.topk`, which is
not stable on CPU; the fast path keeps the same number of them, lowest token ids first. (2) HF's
top-p sums probabilities that a softmax over the *sorted* scores produced; where that running sum
lands within float rounding (about 1e-7 relative) of `1 - top_p`, the token at the cut may differ.
With large, flat vocabularies (100k tokens, tens of thousands kept) that happens in about one row
in a hundred, and concerns a token of probability about 1e-6.

Syncs and compilation. On CPU in eager mode, one check (reading a CPU flag, which costs nothing)
decides whether the candidates suffice. On other devices and under `torch.compile` only the
fixed-shape kernels run: no data-dependent Python control flow and no host-device sync (with
`fullgraph=True`, pass `generator=None` and seed with `torch.manual_seed`: dynamo cannot trace a
`torch.Generator` argument). Rows whose
processors left no finite score (all -inf) are not detected here (that would need a sync); they
get an arbitrary token, where HF's `torch.multinomial` raises.

>>> import torch
>>> from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper
>>> processors = LogitsProcessorList([TemperatureLogitsWarper(0.5), TopPLogitsWarper(0.9)])
>>> scores = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
>>> fast_scores(None, scores.clone(), processors)
tensor([[4., 2., -inf, -inf]])
>>> fast_sample(None, scores.clone(), processors, torch.Generator().manual_seed(0)).shape
torch.Size([1])
"""

from __future__ import annotations

import math
import struct

import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

__all__ = ["draw", "fast_sample", "fast_scores", "top_p_mask"]

_NEG_INF = float("-inf")
_CANDIDATES = (64, 512)  # top-p candidates tried on CPU before the radix select


def fast_scores(input_ids: torch.LongTensor | None, scores: torch.Tensor,
                processors: LogitsProcessorList, *, candidates: bool | None = None) -> torch.Tensor:
    """The scores HF's `processors(input_ids, scores)` returns, computed with the fused kernels.

    Args:
        input_ids: `(batch, seq)` token ids, or None when no processor reads them.
        scores: `(batch, vocab)` float32 scores, a private copy: it is modified in place.
        processors: The `LogitsProcessorList`, in HF's order.
        candidates: Try the candidate shortcut (needs one data-dependent check). Default: on CPU
            outside `torch.compile`. False always runs the fixed-shape kernels.

    Returns:
        `(batch, vocab)` scores, with each filter's `filter_value` where HF's filter removes a token.

    >>> from transformers import TopKLogitsWarper
    >>> fast_scores(None, torch.tensor([[1.0, 3.0, 2.0, 3.0]]), [TopKLogitsWarper(2)])
    tensor([[-inf, 3., -inf, 3.]])
    """
    return _run(input_ids, scores, processors, candidates).materialize()


def fast_sample(input_ids: torch.LongTensor | None, scores: torch.Tensor,
                processors: LogitsProcessorList, generator: torch.Generator | None = None,
                *, candidates: bool | None = None) -> torch.LongTensor:
    """Run `processors` and draw one token per row from HF's final distribution.

    Args:
        input_ids: `(batch, seq)` token ids, or None when no processor reads them.
        scores: `(batch, vocab)` float32 scores, a private copy: it is modified in place.
        processors: The `LogitsProcessorList`, in HF's order (warpers last).
        generator: Seeds the draw; on the device of `scores`. Default: torch's global generator.
        candidates: As in `fast_scores`.

    Returns:
        `(batch,)` int64 token ids drawn from `softmax(processors(input_ids, scores))`: the
        distribution of HF's `torch.multinomial`, not its random stream.

    >>> from transformers import TopKLogitsWarper
    >>> g = torch.Generator().manual_seed(0)
    >>> fast_sample(None, torch.tensor([[0.0, 5.0, 1.0]]), [TopKLogitsWarper(1)], g).tolist()
    [1]
    """
    return _run(input_ids, scores, processors, candidates).sample(generator)


class _State:
    """The scores between processors, plus what the last filter decided but did not write yet.

    Pending: a `temperature` not yet divided in, and either `keep` (a dense `(batch, vocab)` mask,
    with `probs` the softmax before it when known) or `ids`/`cand`/`cand_keep` (the only tokens
    that can survive: `(batch, K)` ids, their scores and which survive). Deferring the writes lets
    the draw skip them when nothing after the filter reads the scores.
    """

    def __init__(self, scores: torch.Tensor) -> None:
        self.scores = scores  # [N, V] float32
        self.probs: torch.Tensor | None = None  # [N, V] softmax(scores), `keep` not applied
        self.keep: torch.Tensor | None = None  # [N, V] bool
        self.ids: torch.Tensor | None = None  # [N, K] int64, distinct per row
        self.cand: torch.Tensor | None = None  # [N, K] float32 scores, sorted descending
        self.cand_keep: torch.Tensor | None = None  # [N, K] bool
        self.filter_value = _NEG_INF
        self.temperature: float | None = None  # a division not yet applied to `scores`

    def materialize(self) -> torch.Tensor:
        """Write the pending temperature and filter into `scores` and return them."""
        n, vocab = self.scores.shape
        if self.temperature is not None:
            self.scores.div_(self.temperature)  # HF: scores / temperature
            self.temperature = None
        if self.ids is not None:
            self.keep = self.scores.new_zeros((n, vocab), dtype=torch.bool).scatter_(1, self.ids, self.cand_keep)
            self.ids = self.cand = self.cand_keep = None
        if self.keep is not None:
            self.scores.masked_fill_(~self.keep, self.filter_value)
            self.keep = None
        self.probs = None
        return self.scores

    def filtered(self, filter_value: float, *, keep=None, probs=None, ids=None, cand=None, cand_keep=None):
        self.filter_value = float(filter_value)
        self.keep, self.probs, self.ids, self.cand, self.cand_keep = keep, probs, ids, cand, cand_keep

    def sample(self, generator: torch.Generator | None) -> torch.LongTensor:
        if self.ids is not None and self.filter_value == _NEG_INF:
            # softmax, not exp: torch.exp on CPU can go through MKL's threaded VML, much slower here
            weights = torch.softmax(self.cand.masked_fill(~self.cand_keep, _NEG_INF), dim=-1)  # [N, K]
            return self.ids.gather(1, _pick(weights, generator)[:, None]).squeeze(1)
        if self.keep is not None and self.probs is not None and self.filter_value == _NEG_INF:
            return draw(torch.where(self.keep, self.probs, 0.0), generator)
        return draw(torch.softmax(self.materialize(), dim=-1), generator)


def _run(input_ids, scores: torch.Tensor, processors, candidates: bool | None) -> _State:
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or scores.dtype != torch.float32:
        got = f"{scores.dtype} of shape {tuple(scores.shape)}" if isinstance(scores, torch.Tensor) else type(scores)
        raise ValueError(f"`scores` must be a float32 tensor of shape (batch, vocab), got {got}.")
    if candidates is None:
        candidates = scores.device.type == "cpu" and not torch.compiler.is_compiling()
    state = _State(scores)
    for processor in processors:
        kind = type(processor)
        if kind is TemperatureLogitsWarper:
            # Deferred: a top-k right after it only needs the division at its candidates.
            state.materialize()
            state.temperature = processor.temperature
        elif kind is TopKLogitsWarper:
            _top_k(state, processor, candidates)
        elif kind is TopPLogitsWarper:
            _top_p(state, processor, candidates)
        elif kind is MinPLogitsWarper:
            probs = torch.softmax(state.materialize(), dim=-1)  # bit for bit HF's probs
            keep = probs >= processor.min_p * probs.amax(dim=-1, keepdim=True)  # HF drops `probs < ...`
            if processor.min_tokens_to_keep > 1:  # with 1 the top token is never below min_p * top
                k = min(processor.min_tokens_to_keep, probs.shape[-1])
                keep.scatter_(-1, torch.topk(probs, k, dim=-1).indices, True)
            state.filtered(processor.filter_value, keep=keep, probs=probs)
        else:
            state.scores = processor(input_ids, state.materialize())
            state.probs = None
    return state


def _top_k(state: _State, processor: TopKLogitsWarper, candidates: bool) -> None:
    if state.keep is not None or state.ids is not None:
        state.materialize()
    vocab = state.scores.shape[-1]
    k = min(processor.top_k, vocab)  # HF's own clamp; HF already folded min_tokens_to_keep into top_k
    if k == vocab:
        return  # HF's threshold is then the row's minimum: nothing is removed
    if candidates:
        # The k best are all that survive unless the (k+1)-th ties with the k-th (HF keeps ties).
        # Dividing by a positive temperature keeps the order, so the candidates of the undivided
        # scores are HF's, and dividing just them gives HF's values bit for bit.
        cand, ids = top_candidates(state.scores, k + 1)  # [N, k+1]
        if state.temperature is not None:
            cand = cand / state.temperature
        if bool((cand[:, k - 1] > cand[:, k]).all()):
            keep = torch.ones_like(ids[:, :k], dtype=torch.bool)
            state.filtered(processor.filter_value, ids=ids[:, :k], cand=cand[:, :k], cand_keep=keep)
            return
    scores = state.materialize()
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]  # [N, 1], as HF
    state.filtered(processor.filter_value, keep=scores >= kth)


def _top_p(state: _State, processor: TopPLogitsWarper, candidates: bool) -> None:
    top_p, at_least = processor.top_p, processor.min_tokens_to_keep
    if state.ids is not None and state.filter_value == _NEG_INF:
        # After top-k every other token has probability 0, so the candidates hold the whole answer.
        cand = state.cand.masked_fill(~state.cand_keep, _NEG_INF)
        probs = torch.softmax(cand, dim=-1)
        kept = _top_p_count(probs, torch.zeros_like(probs[:, :1], dtype=torch.float64), top_p, at_least)
        keep = torch.arange(cand.shape[1], device=cand.device) < kept
        state.filtered(processor.filter_value, ids=state.ids, cand=state.cand, cand_keep=keep)
        return
    scores = state.materialize()
    vocab = scores.shape[-1]
    probs = torch.softmax(scores, dim=-1)  # [N, V]
    total = None
    for k in _CANDIDATES if candidates else ():
        if k > _CANDIDATES[0] and 8 * k > vocab:
            break  # a second top-k this large costs about as much as the radix select
        k = min(k, vocab)
        if at_least >= k:
            break
        cand, ids = top_candidates(scores, k)  # [N, K]
        picked = probs.gather(1, ids)  # [N, K]
        rest = torch.zeros_like(picked[:, :1], dtype=torch.float64)  # [N, 1] mass of the other tokens
        if k < vocab:
            if total is None:
                total = probs.sum(dim=-1, keepdim=True).double()  # 1 up to rounding
            rest = (total - picked.double().sum(dim=-1, keepdim=True)).clamp_(min=0)
        kept = _top_p_count(picked, rest, top_p, at_least)
        # Certain only if the last kept candidate is above every token that is not a candidate.
        last = cand.gather(1, kept - 1)  # [N, 1]
        if k == vocab or bool(((kept < k) & (last > cand[:, -1:])).all()):
            keep = torch.arange(k, device=cand.device) < kept
            state.filtered(processor.filter_value, ids=ids, cand=cand, cand_keep=keep)
            return
        # A larger try can only succeed if its extra tokens, none above the k-th, could reach top_p.
        reach = picked.double().sum(dim=-1) + (_CANDIDATES[-1] - k) * picked[:, -1].double()
        if k == vocab or not bool((reach > top_p).all()):
            break
    keep = top_p_mask(probs, top_p, at_least, scores=scores, branch=candidates)
    state.filtered(processor.filter_value, keep=keep, probs=probs)


def top_candidates(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.LongTensor]:
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
    cand, ids = torch.topk(scores, k, dim=-1)  # [N, k]
    ids, order = ids.sort(dim=-1)
    cand, order = cand.gather(1, order).sort(dim=-1, descending=True, stable=True)
    return cand, ids.gather(1, order)


def _top_p_count(probs: torch.Tensor, rest: torch.Tensor, top_p: float, at_least: int) -> torch.LongTensor:
    """`(batch, 1)` how many of the sorted-descending `probs` HF's top-p keeps.

    HF's cumulative probability at position j is the mass at or below it: `rest` (float64, the
    tokens below every candidate) plus `probs[j:]`, summed from the smallest up as HF's ascending
    `cumsum` does, so that a tail of tiny probabilities keeps its precision. A position is kept if
    that, rounded to float32, is `> 1 - top_p`; the first `at_least` always are.
    """
    cumulative = probs.double().flip(-1).cumsum(dim=-1).flip(-1) + rest  # [N, K]
    cut, inclusive = _rounds_at_most(_float32(1.0 - top_p))
    kept = (cumulative > cut if inclusive else cumulative >= cut).sum(dim=-1, keepdim=True)
    return kept.clamp_(min=min(at_least, probs.shape[-1]))


def _float32(x: float) -> float:
    """`x` rounded to float32, as torch rounds a Python float compared with a float32 tensor."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _rounds_at_most(threshold: float) -> tuple[float, bool]:
    """`(cut, inclusive)`: a double rounds to a float32 `<= threshold` iff it is `< cut` (`<=` if inclusive).

    `threshold` is a non-negative float32; `cut` is the midpoint to the next float32 up, which rounds
    down to `threshold` (ties to even) exactly when `threshold`'s last mantissa bit is 0.
    """
    bits = struct.unpack("<I", struct.pack("<f", threshold))[0]
    above = struct.unpack("<f", struct.pack("<I", bits + 1))[0]
    return (threshold + above) / 2, bits % 2 == 0


def top_p_mask(probs: torch.Tensor, top_p: float, min_tokens_to_keep: int = 1, *,
               scores: torch.Tensor | None = None, branch: bool = False) -> torch.Tensor:
    """The tokens HF's `TopPLogitsWarper(top_p, min_tokens_to_keep)` keeps, by a radix select.

    The kept tokens are those above a boundary probability `p*` plus some of those equal to it.
    For non-negative floats the bit pattern orders like the value, so `p*` is found from two or three
    probability-weighted histograms: of the high bits (which bucket holds the token where HF's
    ascending cumulative sum crosses `1 - top_p`), then of the lower bits inside that bucket. Sums
    are float64, rounded to float32 before the comparison, as HF's `cumsum` (double accumulation on
    CPU) rounds its output. Fixed shapes, no sort, no host-device sync.

    Args:
        probs: `(batch, vocab)` float32 probabilities, `softmax` of the scores.
        top_p: Keep the most probable tokens whose probabilities add up to `top_p`. Range [0, 1].
        min_tokens_to_keep: Keep at least that many tokens. Default: 1.
        scores: The scores `probs` came from; when given, tokens at -inf are the last kept among
            equal (zero) probabilities, as in HF's order.
        branch: Allow one data-dependent check that skips the tie ranking when no tie group is
            split (CPU eager). Default: False, fixed shapes only.

    Returns:
        `(batch, vocab)` bool, True for the tokens kept.

    >>> top_p_mask(torch.tensor([[0.5, 0.2, 0.3]]), 0.7).tolist()
    [[True, False, True]]
    """
    n, vocab = probs.shape
    threshold = _float32(1.0 - top_p)
    cut, inclusive = _rounds_at_most(threshold)
    bits = probs.view(torch.int32)  # [N, V]; p in [0, 1] has bits <= 0x3F800000
    mass = probs.double()  # [N, V]

    # Level 1, the high bits: the bucket of the first token (ascending) whose running sum survives
    # (masked to 31 bits so that a NaN row, e.g. all -inf scores, cannot index out of range). Then the
    # remaining bits inside that bucket, where bin 0 gathers every token below the bucket and the last
    # bin every token above, so the running sum over bins is the one over tokens. Large inputs take
    # two levels (16 + 15 bits), small ones three (11 + 10 + 10) to keep the histograms small.
    high, levels = (15, (15,)) if n * vocab > 1 << 20 else (20, (10, 10))
    bucket = (bits >> high).bitwise_and_((1 << (31 - high)) - 1).long()  # [N, V]; the mask: for NaN
    hist = mass.new_zeros(n, 1 << (31 - high)).scatter_add_(1, bucket, mass)
    prefix = _count_removed(hist.cumsum_(dim=1), cut, inclusive)  # [N, 1]; == bins when every token goes
    nothing = prefix >= hist.shape[1]
    prefix = prefix.clamp_(max=hist.shape[1] - 1).int()
    shift = high
    for width in levels:
        shift -= width
        low = ((bits >> shift) - ((prefix << width) - 1)).clamp_(0, (1 << width) + 1).long()  # [N, V]
        hist = mass.new_zeros(n, (1 << width) + 2).scatter_add_(1, low, mass)
        cum = hist.cumsum(dim=1)
        pos = _count_removed(cum, cut, inclusive).clamp_(1, 1 << width)  # [N, 1] bin inside the bucket
        prefix = (prefix << width) | (pos.int() - 1)
    boundary = prefix  # [N, 1] bits of p*
    below = cum.gather(1, pos - 1)  # [N, 1] mass strictly below p*
    p_star = boundary.view(torch.float32).double().clamp_min_(1e-300)
    ties = (hist.gather(1, pos) / p_star).round_()  # [N, 1] how many tokens equal p* (exact in float64)

    # Ascending, each tie adds p*; those whose running sum still rounds <= threshold go.
    room = (cut - below) / p_star
    gone = room.floor_() if inclusive else room.ceil_().sub_(1)
    kept = ties - gone.clamp_(min=0).minimum(ties)  # [N, 1] ties kept, lowest ids first
    boundary = boundary.masked_fill(nothing, 0x7F800000)  # above every probability: nothing kept

    forced = min_tokens_to_keep > 1 or threshold >= _float32(0.99)
    if forced:
        # HF always keeps its last `min_tokens_to_keep` tokens. With 1 that matters only when the
        # whole mass (about 1) rounds to <= threshold, impossible unless top_p is tiny.
        m = min(min_tokens_to_keep, vocab)
        floor = torch.topk(probs, m, dim=-1).values[..., -1:].view(torch.int32)  # [N, 1]
        above = (bits > floor).sum(dim=-1, keepdim=True) if m > 1 else torch.zeros_like(floor)
        need = m - above.to(kept.dtype)
        longer = (floor < boundary) | ((floor == boundary) & (need > kept))
        boundary = torch.where(longer, floor, boundary)
        kept = torch.where(longer, need, kept)
    elif branch and bool((kept == ties).all()):
        return bits >= boundary  # no tie group is split: no ranking needed
    at_boundary = bits == boundary  # [N, V]
    if forced and scores is not None:
        # HF ranks equal probabilities by score: -inf ones come first, so they are never kept first.
        at_boundary &= scores > _NEG_INF
    rank = torch.cumsum(at_boundary, dim=-1, dtype=torch.int32)  # 1-based among the ties
    return (bits > boundary) | (at_boundary & (rank <= kept.int()))


def _count_removed(cum: torch.Tensor, cut: float, inclusive: bool) -> torch.Tensor:
    """`(batch, 1)` int64 number of leading bins whose running sum rounds to float32 `<= threshold`."""
    return (cum <= cut if inclusive else cum < cut).sum(dim=-1, keepdim=True)


def draw(weights: torch.Tensor, generator: torch.Generator | None = None, block: int | None = None) -> torch.LongTensor:
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
    n, vocab = weights.shape
    if block is None:
        block = 1 << round(math.log2(max(vocab, 1)) / 2)
    weights = weights.contiguous()
    full = vocab // block * block
    sums = weights.as_strided((n, full // block, block), (vocab, block, 1)).sum(dim=-1)  # [N, NB]
    if full < vocab:
        sums = torch.cat([sums, weights[:, full:].sum(dim=-1, keepdim=True)], dim=-1)
    ids = _pick(sums, generator)[:, None] * block + torch.arange(block, device=weights.device)  # [N, B]
    inside = ids < vocab
    ids = ids.clamp_(max=vocab - 1)
    local = weights.gather(1, ids).mul_(inside)  # [N, B]
    return ids.gather(1, _pick(local, generator)[:, None]).squeeze(1)


def _pick(weights: torch.Tensor, generator: torch.Generator | None) -> torch.LongTensor:
    """`(batch,)` index i with probability `w_i / sum(w)`: the first running sum above `U * sum(w)`."""
    running = weights.double().cumsum(dim=-1)  # [N, K]
    total = running[:, -1:]
    uniform = torch.rand(total.shape, generator=generator, device=weights.device, dtype=torch.float64)
    # U < 1 but U * total may round up to total; stay strictly below so a zero weight is never picked.
    target = torch.minimum(uniform * total, total * (1 - 2.0**-52))
    return (running <= target).sum(dim=-1).clamp_(max=weights.shape[-1] - 1)
