"""The top-p route table: the one place that chooses how the fast path applies HF's top-p.

`top_p_plan` returns what the filter leaves pending (`hfbridge._step.fast.pending`); the state
writes it or draws from it. The routes, in the order they are tried:

| route | when | plan |
| --- | --- | --- |
| after top-k | the last filter left candidates and removes with `-inf` | `Candidates`: the cut among them |
| one row | `candidates`, batch 1 (`one_row.py`, NumPy) | `OneRow`, or `Mask` when many are kept |
| candidates | `candidates`, the best tokens prove every row's cut (`candidates.py`) | `Candidates` |
| draw | `candidates`, many kept, `top_p >= 0.5`, every row has a distribution (`draw_then_check.py`) | `Draw` |
| exact | `candidates`, otherwise (`sorted_mask.py` on CPU) | `Mask` |
| compiled | under `torch.compile` (`compiled.py`, `torch.cond`) | `Fixed` |
| device sort | eager, no `candidates`: an accelerator, `accelerator_route()` (`device_sort.py`) | `Mask` |

`top_p` is one value for the batch, or one per row: a `(rows, 1)` float64 tensor (a `Sampler`'s
per-row groups, `_step/plan/per_row.py`'s `tensor_top_p`); every route takes either, so a batch of rows
with distinct top-p values is one draw.

`candidates` (read flags on the host) is on for CPU eager outside `accelerator_route()`
(`hfbridge._step.run.cpu_shortcuts.cpu_shortcuts`). Every route keeps HF's tokens; they differ in cost and in
whether they read a value on the host.

>>> import torch
>>> from hfbridge._step.fast.state import FastState
>>> state = FastState(torch.tensor([[2.0, 1.0, 0.5, -1.0]]))
>>> type(top_p_plan(state, 0.9, 1, candidates=True, memo=None)).__name__
'OneRow'
>>> type(top_p_plan(state, 0.9, 1, candidates=False, memo=None)).__name__
'Mask'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hfbridge._step.fast.candidates import TopPTry, top_p_count
from hfbridge._step.fast.one_row import one_row_after, one_row_kept
from hfbridge._step.fast.pending import Candidates, Draw, Fixed, Mask, OneRow, Pending
from hfbridge._step.fast.top_p.compiled import fixed_top_p
from hfbridge._step.fast.top_p.device_sort import sorted_top_p_keep
from hfbridge._step.fast.top_p.draw_then_check import top_p_route
from hfbridge._step.fast.top_p.mask import TopP
from hfbridge._step.fast.top_p.sorted_mask import exact_top_p_mask

if TYPE_CHECKING:  # pragma: no cover
    from hfbridge._step.fast.state import FastState

__all__ = ["top_p_plan"]

_NEG_INF = float("-inf")


def top_p_plan(state: FastState, top_p: TopP, at_least: int, *, candidates: bool, memo: dict | None) -> Pending:
    """What `TopPLogitsWarper(top_p, min_tokens_to_keep=at_least)` leaves pending on `state`.

    Args:
        state: The fast path's state: the scores and what the last filter left pending (read;
            a pending filter is written first unless the "after top-k" route applies).
        top_p, at_least: The warper's `top_p` (one, or `(batch, 1)` float64: one per row) and
            `min_tokens_to_keep`.
        candidates: Whether host reads are allowed (CPU eager), see the table above.
        memo: The `Sampler`'s dict kept between steps (candidate counts, bounds), or None.
    """
    previous = state.pending
    if isinstance(previous, OneRow) and state.filter_value == _NEG_INF:
        # one CPU row after top-k (or top-p): its candidates hold the whole answer, counted on NumPy
        return one_row_after(previous, float(top_p), at_least)  # a (1, 1) per-row top-p: its float
    if isinstance(previous, Candidates) and state.filter_value == _NEG_INF:
        # After top-k every other token has probability 0, so the candidates hold the whole answer.
        cand = previous.cand if previous.all_kept else previous.cand.masked_fill(~previous.keep, _NEG_INF)  # [N, K]
        probs = torch.softmax(cand, dim=-1)
        kept = top_p_count(probs, torch.zeros_like(probs[:, :1], dtype=torch.float64), top_p, at_least)  # [N, 1]
        # a token an earlier filter removed stays removed, whatever `min_tokens_to_keep` says (HF's is -inf)
        first = torch.arange(cand.shape[1], device=cand.device) < kept  # [N, K]
        return Candidates(previous.ids, previous.cand, previous.keep & first)
    scores = state.current()  # [N, V], read only
    probs = state.softmax()  # [N, V]
    if candidates:
        if scores.shape[0] == 1:
            found = one_row_kept(scores, probs, float(top_p), at_least, memo)  # a (1, 1) top-p: its float
            if isinstance(found, torch.Tensor):  # one row, too many kept for candidates: the mask
                return Mask(found, probs)
            if found is not None:  # the kept tokens, as NumPy arrays
                return OneRow(*found)
        route = top_p_route(scores, probs, top_p, at_least, memo)
        if isinstance(route, TopPTry):  # the candidates hold every row's cut
            return Candidates(route.ids, route.cand, route.keep())
        if route is not None:  # many tokens survive: the draw checks its token; readers find the cut
            return Draw(route, probs)
        return Mask(exact_top_p_mask(probs, top_p, at_least, scores=scores), probs)
    if torch.compiler.is_compiling():  # fixed shapes, candidates first, on the device
        return Fixed(fixed_top_p(scores, top_p, at_least))
    # eager on an accelerator: HF's own sort, one fast kernel there and no host read (the radix
    # select of `compiled.top_p_keep` took 13-40x longer on an H200, benchmarks/gpu.py)
    return Mask(sorted_top_p_keep(scores, top_p, at_least), probs)
