"""The fast path: HF's sampling distribution without a full sort or `torch.multinomial`.

`fast_sample` walks a `LogitsProcessorList` in order. Processors it knows are replaced by fused
kernels that keep the tokens HF's keep; any other processor is called through HF unchanged, in its
place. Known processors are matched by exact type (a subclass that overrides `__call__` goes
through HF), and their parameters (`filter_value`, `min_tokens_to_keep`, ...) are read from them.
The other processors get a private copy of the scores, which they may write into (`owned_scores()`);
hfbridge's penalties, which return a new tensor anyway, get borrowed scores as they are.
What a filter decides is kept pending in a `FastState` (`state.py`), as one tagged value
(`pending.py`), and written into the scores only if something reads them. Which top-p route runs
is decided in one place, `top_p/route_table.py`. The processors it knows:

- `TemperatureLogitsWarper`: the same `scores / temperature`, deferred: a top-k right after it
  divides only its candidates (dividing by a positive number keeps the order). Scores lent
  read-only (`read_only=True`, as `Sampler` lends its float32 rows) are divided out of place: the
  division is the private copy.
- `TopKLogitsWarper`: HF's threshold, the k-th largest score; ties with it all survive, as in HF.
  The draw then looks at the k candidates only.
- `TopPLogitsWarper`: HF sorts ascending and drops every token whose cumulative probability is
  `<= 1 - top_p` (a float32 comparison), keeping its last `min_tokens_to_keep`. Here the cut is
  found without the sort among 64 (then 512) candidates, the best scores (`_step/fast/candidates.py`), when
  a check proves they contain it. When more tokens survive, the draw needs no cut: it draws from
  the whole softmax and keeps the token if HF does (at once for the candidates that surely
  survive, else by the running sum at the token's place), drawing that row again if not
  (`_step/fast/top_p/draw_then_check.py`; candidates that a bound shows cannot hold the cut are not even tried).
  Scores that something reads (`fast_scores`, a later processor, an error message) get the cut
  from a sorted compaction or a radix select over the bits of the probabilities.
- `MinPLogitsWarper`: HF's own arithmetic; its softmax is reused for the draw. After a top-k (or a
  top-p after it) that left candidates, on those only when rounding cannot change a decision
  (`_step/fast/min_p_candidates.py`): no pass over the vocabulary after the top-k.

A single row on CPU (batch 1) finds the top-p cut in `_step/fast/one_row.py` instead, on NumPy views (torch's
fixed cost per op would outweigh the data): a compaction of the tokens above a bound, or a
histogram of the probabilities' bits when many tokens are kept.

The draw inverts a float64 running sum with one uniform number: over the candidates when the last
filter left candidates, otherwise in two levels (block sums, then inside the chosen block). No
`torch.multinomial`, no vocabulary-sized random tensor; reproducible with a `torch.Generator`.

What "the same" means. `fast=True` gives HF's distribution, not HF's random stream: the tokens
differ from `torch.multinomial`'s for the same seed. Surviving scores are bit for bit HF's, and the
renormalised probabilities agree to float rounding. Tokens of equal float32 probability but
different scores are ordered by score, as HF's sort of the scores orders them (`_step/fast/top_p/mask.py`). Two
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
`torch.cond` runs the radix select only when a row's cut is not among them (`top_p/compiled.py`);
eager on an accelerator the radix select runs alone, as `torch.cond` would read its flag on the host.
`with accelerator_route():` (`_step/run/cpu_shortcuts.py`) runs that eager accelerator route on CPU too.

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

from hfbridge._step.fast.candidates import top_candidates
from hfbridge._step.fast.min_p_candidates import min_p_among
from hfbridge._step.fast.one_row import divided, one_row_top_k
from hfbridge._step.fast.pending import Candidates, Mask, OneRow
from hfbridge._step.fast.state import FastState
from hfbridge._step.fast.top_p.mask import top_p_mask
from hfbridge._step.fast.top_p.route_table import top_p_plan
from hfbridge._step.fast.weighted_draw import draw
from hfbridge._step.run.cpu_shortcuts import cpu_shortcuts
from hfbridge._step.run.processor_list import Recorder, check_processor_output
from hfbridge.processors import PresenceFrequencyPenaltyLogitsProcessor
from hfbridge.processors._cpu_side import owned_scores

__all__ = ["FastDraw", "draw", "fast_draw", "fast_sample", "fast_scores", "top_candidates", "top_p_mask"]

_NEG_INF = float("-inf")
# hfbridge's processors that return a new tensor whenever they change the scores (their out-of-place
# scatter is a copy) and leave the scores they get untouched outside `owned_scores()`
_COPYING = frozenset({PresenceFrequencyPenaltyLogitsProcessor})


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

    def __init__(self, tokens: torch.Tensor, valid: torch.Tensor | bool, state: FastState) -> None:
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
        return self._state.private()


def fast_draw(input_ids: torch.Tensor | None, scores: torch.Tensor, processors: LogitsProcessorList,
              generator: torch.Generator | None = None, *, candidates: bool | None = None,
              memo: dict | None = None, read_only: bool = False, record: Recorder | None = None) -> FastDraw:
    """`fast_sample` that also says, without a host-device sync, which rows could be sampled.

    Args:
        memo: A dict the caller keeps between steps (a `Sampler` does): the candidate counts that
            sufficed last time, tried first next time (successive steps look alike). Default: none.
        read_only: `scores` is not a private copy: it is never written, and copied only where a
            processor writes (a temperature divides out of place, so the division is the copy).
            Default: False, `scores` is modified in place.
        record: Called as `record(processor, scores)` after each processor, in order, with a copy of the
            scores it leaves (the fused ones' decisions written into the copy only: the draw is the same).
        Others: as `fast_sample`.

    Returns:
        A `FastDraw`: `tokens`, the `valid` flag per row, and `final_scores()`.

    >>> from transformers import TopKLogitsWarper
    >>> out = fast_draw(None, torch.tensor([[0.0, 5.0, 1.0], [float("nan"), 0.0, 1.0]]), [TopKLogitsWarper(2)])
    >>> out.valid.tolist()
    [True, False]
    """
    state = _run(input_ids, scores, processors, candidates, memo, read_only=read_only, record=record)
    tokens, valid = state.sample(generator)
    return FastDraw(tokens, valid, state)


def _run(input_ids: torch.Tensor | None, scores: torch.Tensor, processors: Any, candidates: bool | None,
         memo: dict | None = None, *, read_only: bool = False, record: Recorder | None = None) -> FastState:
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or scores.dtype != torch.float32:
        got = f"{scores.dtype} of shape {tuple(scores.shape)}" if isinstance(scores, torch.Tensor) else type(scores)
        raise ValueError(f"`scores` must be a float32 tensor of shape (batch, vocab), got {got}.")
    if candidates is None:
        candidates = cpu_shortcuts(scores)
    state = FastState(scores, read_only=read_only, memo=memo if candidates else None)  # CPU eager: lent buffers
    for index, processor in enumerate(processors):
        _apply(state, index, processor, input_ids, candidates, memo)
        if record is not None:
            record(processor, state.peek())  # [N, V]
    return state


def _apply(state: FastState, index: int, processor: Any, input_ids: torch.Tensor | None, candidates: bool,
           memo: dict | None) -> None:
    """One processor of the list on the state: fused when known, else called."""
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
        if candidates and _min_p_on_candidates(state, processor):
            return
        probs = state.softmax()  # bit for bit HF's probs
        # HF's comparison, negated (not `>=`): a NaN row keeps its NaN, as in HF
        keep = (probs < processor.min_p * probs.amax(dim=-1, keepdim=True)).logical_not_()
        if processor.min_tokens_to_keep > 1:  # with 1 the top token is never below min_p * top
            k = min(processor.min_tokens_to_keep, probs.shape[-1])
            keep.scatter_(-1, torch.topk(probs, k, dim=-1).indices, True)
        state.filtered(processor.filter_value, Mask(keep, probs))
    elif kind in _COPYING and not state.owned and state.pending is None and state.temperature is None:
        # Borrowed scores go to it as they are: it leaves them untouched and returns its own
        # tensor, which becomes the private copy (a copy made here first would be a second one).
        lent = state.scores
        output = processor(input_ids, lent)
        state.scores = check_processor_output(processor, lent, output, index=index)
        state.owned = output is not lent  # the borrowed tensor itself when it had nothing to do
    else:
        # a private tensor the processor may write into; one of its own unless the class is known to keep nothing
        scores = state.materialize() if _keeps_no_scores(kind) else state.private()
        with owned_scores():
            output = processor(input_ids, scores)
        # a processor run here gets the check CheckedProcessorList gives it in exact mode
        state.scores = check_processor_output(processor, scores, output, index=index)
        state.lent = state.lent and state.scores is scores


def _keeps_no_scores(kind: type) -> bool:
    """Whether `kind` is one of hfbridge's samplers or transformers' processors, which keep no reference to the
    scores they receive: they may get a buffer the fast path lends itself from step to step (`workspace.py`)."""
    return kind.__module__.startswith(_KEEP_NO_SCORES)


_KEEP_NO_SCORES = ("hfbridge.processors.", "transformers.generation.")


def _top_k(state: FastState, processor: TopKLogitsWarper, candidates: bool) -> None:
    if state.pending is not None:
        state.materialize()
    vocab = state.scores.shape[-1]
    k = min(processor.top_k, vocab)  # HF's own clamp; HF already folded min_tokens_to_keep into top_k
    if k == vocab:
        return  # HF's threshold is then the row's minimum: nothing is removed
    # The k best are all that survive unless the (k+1)-th ties with the k-th (HF keeps ties).
    # Dividing by a positive temperature keeps the order, so the candidates of the undivided
    # scores are HF's, and dividing just them gives HF's values bit for bit.
    found = one_row_top_k(state.scores, k + 1) if candidates and state.scores.shape[0] == 1 else None
    if found is not None:  # one CPU row, NumPy, [k+1] each: torch's per-op cost would dominate
        values, row_ids = found
        if state.temperature is not None:  # NumPy's float32 division is torch's, bit for bit (IEEE)
            values = divided(values, float(state.temperature))  # a (1, 1) per-row one: its float
        if values[k - 1] > values[k]:
            state.filtered(processor.filter_value, OneRow(row_ids[:k], values[:k]))
            return
    elif candidates:
        cand, ids = top_candidates(state.scores, k + 1)  # [N, k+1]
        if state.temperature is not None:
            cand = cand / state.temperature
        if bool((cand[:, k - 1] > cand[:, k]).all()):
            keep = torch.ones_like(ids[:, :k], dtype=torch.bool)
            state.filtered(processor.filter_value, Candidates(ids[:, :k], cand[:, :k], keep, all_kept=True))
            return
    scores = state.divided()
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]  # [N, 1], as HF
    state.filtered(processor.filter_value, Mask((scores < kth).logical_not_()))  # HF's test: NaN stays


def _min_p_on_candidates(state: FastState, processor: MinPLogitsWarper) -> bool:
    """HF's min-p decided on the candidates a top-k (or top-p) left, when it can be: True if done."""
    pending = state.pending
    if (not isinstance(pending, (Candidates, OneRow)) or state.filter_value != _NEG_INF
            or processor.filter_value != _NEG_INF or processor.min_tokens_to_keep != 1):
        return False
    decided = min_p_among(pending, processor.min_p)
    if decided is None:
        return False
    state.filtered(processor.filter_value, decided)
    return True


def _top_p(state: FastState, processor: TopPLogitsWarper, candidates: bool, memo: dict | None) -> None:
    # which route: the one table in `top_p/route_table.py`
    plan = top_p_plan(state, processor.top_p, processor.min_tokens_to_keep, candidates=candidates, memo=memo)
    state.filtered(processor.filter_value, plan)
