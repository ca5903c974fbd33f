"""The fast path: HF's sampling distribution without a full sort or `torch.multinomial`.

`fast_sample` walks a `LogitsProcessorList` in order. Processors it knows are replaced by fused
kernels that keep the tokens HF's keep; any other processor is called through HF unchanged, in its
place. Known processors are matched by exact type (a subclass that overrides `__call__` goes
through HF), and their parameters (`filter_value`, `min_tokens_to_keep`, ...) are read from them:

- `TemperatureLogitsWarper`: the same `scores / temperature`, deferred: a top-k right after it
  divides only its candidates (dividing by a positive number keeps the order). Scores lent
  read-only (`read_only=True`, as `Sampler` lends its float32 rows) are divided out of place: the
  division is the private copy.
- `TopKLogitsWarper`: HF's threshold, the k-th largest score; ties with it all survive, as in HF.
  The draw then looks at the k candidates only.
- `TopPLogitsWarper`: HF sorts ascending and drops every token whose cumulative probability is
  `<= 1 - top_p` (a float32 comparison), keeping its last `min_tokens_to_keep`. Here the cut is
  found without the sort among 64 (then 512) candidates, the best scores (`_candidates.py`), when
  a check proves they contain it. When more tokens survive, the draw needs no cut: it draws from
  the whole softmax and keeps the token if HF does (at once for the candidates that surely
  survive, else by the running sum at the token's place), drawing that row again if not
  (`_top_p_draw.py`; candidates that a bound shows cannot hold the cut are not even tried).
  Scores that something reads (`fast_scores`, a later processor, an error message) get the cut
  from a sorted compaction or a radix select over the bits of the probabilities.
- `MinPLogitsWarper`: HF's own arithmetic; its softmax is reused for the draw.

A single row on CPU (batch 1) finds the top-p cut in `_one_row.py` instead, on NumPy views (torch's
fixed cost per op would outweigh the data): a compaction of the tokens above a bound, or a
histogram of the probabilities' bits when many tokens are kept.

The draw inverts a float64 running sum with one uniform number: over the candidates when the last
filter left candidates, otherwise in two levels (block sums, then inside the chosen block). No
`torch.multinomial`, no vocabulary-sized random tensor; reproducible with a `torch.Generator`.

What "the same" means. `fast=True` gives HF's distribution, not HF's random stream: the tokens
differ from `torch.multinomial`'s for the same seed. Surviving scores are bit for bit HF's, and the
renormalised probabilities agree to float rounding. Tokens of equal float32 probability but
different scores are ordered by score, as HF's sort of the scores orders them (`_top_p.py`). Two
places where HF's own result depends on details it does not specify: (1) when tokens of exactly
equal score straddle a cut (top-k, top-p, or `min_tokens_to_keep`), HF keeps some of them in the
order of `torch.sort` / `torch.topk`, which is not stable on CPU; the fast path keeps the same
number of them, lowest token ids first. (2) HF's
top-p sums probabilities that a softmax over the *sorted* scores produced; where that running sum
lands within float rounding (about 1e-7 relative) of `1 - top_p`, the token at the cut may differ.
With large, flat vocabularies (100k tokens, tens of thousands kept) that happens in about one row
in a hundred, and concerns a token of probability about 1e-6.

Syncs and compilation. On CPU in eager mode, a few checks (reading CPU flags, which costs nothing)
decide whether the candidates suffice and which rows draw again. On other devices and under
`torch.compile` only the fixed-shape kernels run: no data-dependent Python control flow and no host-device sync (with
`fullgraph=True`, pass `generator=None` and seed with `torch.manual_seed`: dynamo cannot trace a
`torch.Generator` argument). Compiled, top-p takes a fixed 512 candidates and draws among them;
`torch.cond` runs the radix select only when a row's cut is not among them (`_fixed_shape.py`); eager on an accelerator
the radix select runs alone, as `torch.cond` would read its flag on the host.
`with accelerator_route():` (`_routes.py`) runs that eager accelerator route on CPU too.

Rows that cannot be sampled. A row whose final scores hold NaN or `+inf`, or nothing above `-inf`,
has no distribution; HF's `torch.multinomial` fails on it. The fused kernels give such a row an
in-range token and, without a sync, a False in `FastDraw.valid`; the filters leave the cause in such
a row as HF's do (its NaN and `+inf` stay), so `FastDraw.final_scores()` explains it as exact mode
would. `Sampler` reads the flag and raises exact mode's error (`Sampler.check_rows`).
`fast_sample` alone returns the tokens only.

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

from typing import Any

import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ._candidates import TopPTry, top_candidates, top_p_count
from ._draw import draw, draw_checked, draw_kept, draw_one_row_known, pick
from ._fixed_shape import FixedTopP, fixed_top_p, top_p_keep
from ._one_row import one_row_kept
from ._processor_list import check_processor_output
from ._routes import cpu_shortcuts
from ._top_p import top_p_mask
from ._top_p_draw import TopPDraw, draw_top_p, top_p_route
from ._top_p_sorted import top_p_mask_sorted

__all__ = ["FastDraw", "draw", "fast_draw", "fast_sample", "fast_scores", "top_candidates", "top_p_mask"]

_NEG_INF = float("-inf")


def fast_scores(input_ids: torch.Tensor | None, scores: torch.Tensor,
                processors: LogitsProcessorList, *, candidates: bool | None = None) -> torch.Tensor:
    """The scores HF's `processors(input_ids, scores)` returns, computed with the fused kernels.

    Args:
        input_ids: `(batch, seq)` token ids, or None when no processor reads them.
        scores: `(batch, vocab)` float32 scores, a private copy: it is modified in place.
        processors: The `LogitsProcessorList`, in HF's order.
        candidates: Try the candidate shortcut (needs one data-dependent check). Default: on CPU
            outside `torch.compile` and `accelerator_route()`. False always runs the fixed-shape kernels.

    Returns:
        `(batch, vocab)` scores, with each filter's `filter_value` where HF's filter removes a token.

    >>> from transformers import TopKLogitsWarper
    >>> fast_scores(None, torch.tensor([[1.0, 3.0, 2.0, 3.0]]), [TopKLogitsWarper(2)])
    tensor([[-inf, 3., -inf, 3.]])
    """
    return _run(input_ids, scores, processors, candidates).materialize()


def fast_sample(input_ids: torch.Tensor | None, scores: torch.Tensor,
                processors: LogitsProcessorList, generator: torch.Generator | None = None,
                *, candidates: bool | None = None) -> torch.Tensor:
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
    return fast_draw(input_ids, scores, processors, generator, candidates=candidates).tokens


class FastDraw:
    """What `fast_draw` returns: the tokens, which rows had a distribution, and HF's final scores.

    Attributes:
        tokens: `(batch,)` int64 token ids; in range for every row, meaningful where `valid`.
        valid: `(batch,)` bool on the device of the scores: False for a row whose final scores hold
            NaN or `+inf` or nothing above `-inf` (HF's `torch.multinomial` fails on it). Computed
            without a host-device sync; reading it is the caller's choice of sync point.
        known_valid: Whether every row is valid when the route already knows it on the host (the
            one-row CPU draw), else None: then only `valid` tells.
    """

    def __init__(self, tokens: torch.Tensor, valid: torch.Tensor | bool, state: _State) -> None:
        self.tokens = tokens  # [N]
        self._valid = valid  # [N] bool, or a single row's answer known on the host
        self._state = state

    @property
    def valid(self) -> torch.Tensor:
        if isinstance(self._valid, bool):  # built on demand: a step that is valid never needs the tensor
            self._valid = torch.tensor([self._valid], device=self.tokens.device)
        return self._valid

    @property
    def known_valid(self) -> bool | None:
        return self._valid if isinstance(self._valid, bool) else None

    def final_scores(self) -> torch.Tensor:
        """`(batch, vocab)` the scores HF's processors return for this step (written on demand).

        Used to explain an invalid row with exact mode's error: such a row keeps what made it
        invalid (its NaN, its `+inf`, or only `-inf`), as it does in HF.
        """
        return self._state.materialize()


def fast_draw(input_ids: torch.Tensor | None, scores: torch.Tensor, processors: LogitsProcessorList,
              generator: torch.Generator | None = None, *, candidates: bool | None = None,
              memo: dict | None = None, read_only: bool = False) -> FastDraw:
    """`fast_sample` that also says, without a host-device sync, which rows could be sampled.

    Args:
        memo: A dict the caller keeps between steps (a `Sampler` does): the candidate counts that
            sufficed last time, tried first next time (successive steps look alike). Default: none.
        read_only: `scores` is not a private copy: it is never written, and copied only where a
            processor writes (a temperature divides out of place, so the division is the copy).
            Default: False, `scores` is modified in place.
        Others: as `fast_sample`.

    Returns:
        A `FastDraw`: `tokens`, the `valid` flag per row, and `final_scores()`.

    >>> from transformers import TopKLogitsWarper
    >>> out = fast_draw(None, torch.tensor([[0.0, 5.0, 1.0], [float("nan"), 0.0, 1.0]]), [TopKLogitsWarper(2)])
    >>> out.valid.tolist()
    [True, False]
    """
    state = _run(input_ids, scores, processors, candidates, memo, read_only=read_only)
    tokens, valid = state.sample(generator)
    return FastDraw(tokens, valid, state)


class _State:
    """The scores between processors, plus what the last filter decided but did not write yet.

    Pending: a `temperature` not yet divided in, and either `keep` (a dense `(batch, vocab)` mask,
    with `probs` the softmax before it when known) or `ids`/`cand`/`cand_keep` (the only tokens
    that can survive: `(batch, K)` ids, their scores and which survive). Deferring the writes lets
    the draw skip them when nothing after the filter reads the scores.
    """

    # Slots: under torch.compile, torch 2.13's dynamo drops the attribute writes made after a
    # `torch.cond` (the fixed-shape top-p's) to an object with a `__dict__` created in the graph.
    __slots__ = ("all_kept", "cand", "cand_keep", "filter_value", "fixed", "ids", "keep", "kept_arrays", "owned",
                 "probs", "scores", "temperature", "top_p")

    def __init__(self, scores: torch.Tensor, *, read_only: bool = False) -> None:
        self.scores = scores  # [N, V] float32
        self.owned = not read_only  # False: the caller's tensor, copied before anything writes to it
        self.probs: torch.Tensor | None = None  # [N, V] softmax(scores), `keep` not applied
        self.keep: torch.Tensor | None = None  # [N, V] bool
        self.ids: torch.Tensor | None = None  # [N, K] int64, distinct per row
        self.cand: torch.Tensor | None = None  # [N, K] float32 scores, sorted descending
        self.cand_keep: torch.Tensor | None = None  # [N, K] bool
        self.all_kept = False  # `cand_keep` is known to be all True (the one-row draw then skips it)
        # the one-row route's kept `(ids, scores)`, `(K,)` NumPy arrays: `ids`/`cand` made only when read
        self.kept_arrays: tuple[Any, Any] | None = None
        self.filter_value = _NEG_INF
        self.temperature: float | None = None  # a division not yet applied to `scores`
        # a top-p cut not found yet, left to the draw (`_top_p_draw.py`), with `probs`
        self.top_p: TopPDraw | None = None
        self.fixed: FixedTopP | None = None  # a top-p cut found on fixed shapes (compiled), not applied yet

    @property
    def pending(self) -> bool:
        """A filter decided but not written into `scores`."""
        return (self.keep is not None or self.ids is not None or self.top_p is not None or self.kept_arrays is not None
                or self.fixed is not None)

    def divided(self) -> torch.Tensor:
        """`scores` with the pending temperature divided in (not the pending filter), to read only.

        A borrowed tensor is divided out of place: one pass that is also the private copy.
        """
        if self.temperature is not None:
            if self.owned:
                self.scores.div_(self.temperature)  # HF: scores / temperature
            else:
                self.scores, self.owned = self.scores / self.temperature, True
            self.temperature = None
        return self.scores

    def current(self) -> torch.Tensor:
        """The scores with everything pending applied, to read only: a pending filter is written
        (into a private tensor), a pending temperature alone is only divided in."""
        if self.pending:
            return self.materialize()
        return self.divided()

    def materialize(self) -> torch.Tensor:
        """Write the pending temperature and filter into `scores` and return them (a private tensor)."""
        n, vocab = self.scores.shape
        self.divided()
        if not self.owned:
            self.scores, self.owned = self.scores.clone(), True
        self._find_top_p_cut()
        if self.kept_arrays is not None:
            ids, cand = self.kept_arrays
            self.ids, self.cand = torch.from_numpy(ids[None]), torch.from_numpy(cand[None])  # [1, K]
            self.cand_keep, self.kept_arrays = torch.ones_like(self.ids, dtype=torch.bool), None
        if self.fixed is not None:
            self.scores, self.fixed = self.fixed.apply(self.filter_value), None
        if self.ids is not None:
            assert self.cand_keep is not None  # set together with `ids`
            self.keep = self.scores.new_zeros((n, vocab), dtype=torch.bool).scatter_(1, self.ids, self.cand_keep)
            self.ids = self.cand = self.cand_keep = None
        if self.keep is not None:
            self.scores.masked_fill_(~self.keep, self.filter_value)
            self.keep = None
        self.probs = None
        return self.scores

    def filtered(self, filter_value: float, *, keep: torch.Tensor | None = None, probs: torch.Tensor | None = None,
                 ids: torch.Tensor | None = None, cand: torch.Tensor | None = None,
                 cand_keep: torch.Tensor | None = None, all_kept: bool = False,
                 kept_arrays: tuple[Any, Any] | None = None, fixed: FixedTopP | None = None) -> None:
        self.filter_value = float(filter_value)
        self.keep, self.probs, self.ids, self.cand, self.cand_keep = keep, probs, ids, cand, cand_keep
        self.all_kept, self.kept_arrays = all_kept, kept_arrays
        self.top_p, self.fixed = None, fixed

    def _find_top_p_cut(self) -> None:
        """Turn a pending top-p into `keep`: the exact cut over the whole row (`_top_p_sorted.py`)."""
        if self.top_p is not None:
            assert self.probs is not None  # set with `top_p`
            top_p, at_least = self.top_p.top_p, self.top_p.at_least
            if self.probs.device.type == "cpu":
                self.keep = top_p_mask_sorted(self.probs, top_p, at_least, scores=self.scores)
            else:
                self.keep = top_p_mask(self.probs, top_p, at_least, scores=self.scores, branch=True)
            self.top_p = None

    def sample(self, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | bool]:
        """`(batch,)` tokens and `(batch,)` bool validity (a Python bool from the one-row CPU draw):
        the softmax of a row with NaN, `+inf` or only `-inf` is all NaN, and the draw flags NaN weights."""
        if self.kept_arrays is not None and self.filter_value == _NEG_INF:
            return draw_kept(*self.kept_arrays, None, generator)  # the one-row route's kept tokens, as they are
        if self.ids is not None and self.filter_value == _NEG_INF:
            assert self.cand is not None and self.cand_keep is not None  # set together with `ids`
            # Unnormalised exp(cand - max): each weight is the same whatever the number of
            # candidates, so the token does not depend on how many were tried (pick's running sum
            # is sequential). NaN for a row whose best is NaN, +inf or -inf: flagged by `pick`.
            if self.ids.shape[0] == 1:  # `ids` come from the CPU candidate routes only
                return draw_one_row_known(self.ids, self.cand, None if self.all_kept else self.cand_keep, generator)
            weights = (self.cand - self.cand[:, :1]).exp_().masked_fill_(~self.cand_keep, 0.0)  # [N, K]
            index, valid = pick(weights, generator)
            return self.ids.gather(1, index[:, None]).squeeze(1), valid
        if self.fixed is not None and self.filter_value == _NEG_INF:
            return self.fixed.draw(generator)  # over the candidates where they hold the cut
        if self.top_p is not None and self.filter_value == _NEG_INF:
            assert self.probs is not None  # set with `top_p`
            tried, top_p, at_least, total = self.top_p
            drawn = draw_top_p(self.scores, self.probs, tried, top_p, at_least, generator, total=total)
            if drawn is not None:
                return drawn
            self._find_top_p_cut()  # no distribution in some row, or min_tokens_to_keep too large
        if self.keep is not None and self.probs is not None and self.filter_value == _NEG_INF:
            # in place: nothing reads `probs` after the draw (the error message uses `scores`)
            return draw_checked(_zero_removed(self.probs, self.keep), generator)
        return draw_checked(torch.softmax(self.materialize(), dim=-1), generator)


def _zero_removed(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """`probs` with 0 where `keep` is False, in place: a multiply by the mask's bytes, which costs
    a fifth of `masked_fill_` on CPU. A removed probability is never NaN or inf, so 0 it is."""
    return probs.mul_(keep.view(torch.uint8))


def _run(input_ids: torch.Tensor | None, scores: torch.Tensor, processors: Any, candidates: bool | None,
         memo: dict | None = None, *, read_only: bool = False) -> _State:
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or scores.dtype != torch.float32:
        got = f"{scores.dtype} of shape {tuple(scores.shape)}" if isinstance(scores, torch.Tensor) else type(scores)
        raise ValueError(f"`scores` must be a float32 tensor of shape (batch, vocab), got {got}.")
    if candidates is None:
        candidates = cpu_shortcuts(scores)
    state = _State(scores, read_only=read_only)
    for index, processor in enumerate(processors):
        kind = type(processor)
        if kind is TemperatureLogitsWarper:
            # Deferred: a top-k right after it only needs the division at its candidates.
            state.current()
            state.temperature = processor.temperature
        elif kind is TopKLogitsWarper:
            _top_k(state, processor, candidates)
        elif kind is TopPLogitsWarper:
            _top_p(state, processor, candidates, memo)
        elif kind is MinPLogitsWarper:
            probs = torch.softmax(state.current(), dim=-1)  # bit for bit HF's probs
            # HF's comparison, negated (not `>=`): a NaN row keeps its NaN, as in HF
            keep = (probs < processor.min_p * probs.amax(dim=-1, keepdim=True)).logical_not_()
            if processor.min_tokens_to_keep > 1:  # with 1 the top token is never below min_p * top
                k = min(processor.min_tokens_to_keep, probs.shape[-1])
                keep.scatter_(-1, torch.topk(probs, k, dim=-1).indices, True)
            state.filtered(processor.filter_value, keep=keep, probs=probs)
        else:
            scores = state.materialize()
            # a processor run here gets the check CheckedProcessorList gives it in exact mode
            state.scores = check_processor_output(processor, scores, processor(input_ids, scores), index=index)
            state.probs = None
    return state


def _top_k(state: _State, processor: TopKLogitsWarper, candidates: bool) -> None:
    if state.pending:
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
            state.filtered(processor.filter_value, ids=ids[:, :k], cand=cand[:, :k], cand_keep=keep, all_kept=True)
            return
    scores = state.divided()
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]  # [N, 1], as HF
    state.filtered(processor.filter_value, keep=(scores < kth).logical_not_())  # HF's test: NaN stays


def _top_p(state: _State, processor: TopPLogitsWarper, candidates: bool, memo: dict | None) -> None:
    top_p, at_least = processor.top_p, processor.min_tokens_to_keep
    if state.ids is not None and state.filter_value == _NEG_INF:
        assert state.cand is not None and state.cand_keep is not None  # set together with `ids`
        # After top-k every other token has probability 0, so the candidates hold the whole answer.
        cand = state.cand.masked_fill(~state.cand_keep, _NEG_INF)
        probs = torch.softmax(cand, dim=-1)
        kept = top_p_count(probs, torch.zeros_like(probs[:, :1], dtype=torch.float64), top_p, at_least)
        keep = torch.arange(cand.shape[1], device=cand.device) < kept
        state.filtered(processor.filter_value, ids=state.ids, cand=state.cand, cand_keep=keep)
        return
    scores = state.current()  # read only
    probs = torch.softmax(scores, dim=-1)  # [N, V]
    if candidates:
        if scores.shape[0] == 1:
            found = one_row_kept(scores, probs, top_p, at_least, memo)
            if isinstance(found, torch.Tensor):  # one row, too many kept for candidates: the mask
                state.filtered(processor.filter_value, keep=found, probs=probs)
                return
            if found is not None:  # the kept tokens, as NumPy arrays
                state.filtered(processor.filter_value, kept_arrays=found)
                return
        route = top_p_route(scores, probs, top_p, at_least, memo)
        if isinstance(route, TopPTry):  # the candidates hold every row's cut
            state.filtered(processor.filter_value, ids=route.ids, cand=route.cand, cand_keep=route.keep())
            return
        if route is not None:
            # Many tokens survive: a draw checks its token instead (`_top_p_draw`); scores that
            # something reads find the cut then (`_find_top_p_cut`).
            state.filtered(processor.filter_value, probs=probs)
            state.top_p = route
            return
    if candidates and probs.device.type == "cpu":
        keep = top_p_mask_sorted(probs, top_p, at_least, scores=scores)
    elif candidates:
        keep = top_p_mask(probs, top_p, at_least, scores=scores, branch=True)
    elif torch.compiler.is_compiling():  # fixed shapes, candidates first, on the device (`_fixed_shape.py`)
        state.filtered(processor.filter_value, fixed=fixed_top_p(scores, top_p, at_least))
        return
    else:  # eager fixed shapes: the radix select (`torch.cond` would read its flag on the host)
        keep = top_p_keep(scores, probs, top_p, at_least)
    state.filtered(processor.filter_value, keep=keep, probs=probs)
