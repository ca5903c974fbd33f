"""The route of a step, decided in one place: which of the four ways a `Sampler` step goes.

- `ARGMAX`: greedy with nothing to process: HF's argmax read straight off the logits, no copy.
- `GREEDY`: the processors on a float32 copy, then the argmax.
- `EXACT`: the processors on a float32 copy, then HF's softmax and `torch.multinomial`.
- `FAST`: hfbridge's fused path (HF's distribution, not HF's random stream); it keeps no processed scores.

Every host (`Sampler.step`, `Sampler.next_tokens`, `Sampler.explain`, `generate`'s loop) asks
`decide_route` (through `Sampler.route`) and branches on its answer; nothing else decides fast vs exact
or whether the step copies the logits.

>>> decide_route(fast=True, do_sample=True, has_processors=True, keep_scores=False, keep_raw=False)
<Route.FAST: 'fast'>
>>> decide_route(fast=True, do_sample=True, has_processors=True, keep_scores=True, keep_raw=False)
<Route.EXACT: 'exact'>
>>> decide_route(fast=False, do_sample=False, has_processors=False, keep_scores=False, keep_raw=False)
<Route.ARGMAX: 'argmax'>
"""

from __future__ import annotations

import enum

__all__ = ["Route", "decide_route"]


class Route(enum.Enum):
    """The four ways a step goes (see the module's docstring)."""

    ARGMAX = "argmax"
    GREEDY = "greedy"
    EXACT = "exact"
    FAST = "fast"


def decide_route(*, fast: bool, do_sample: bool, has_processors: bool, keep_scores: bool, keep_raw: bool) -> Route:
    """The route of a step.

    Args:
        fast: The sampler was built with `fast=True`.
        do_sample: The sampler samples (a row's temperature of 0 makes that row greedy inside the draw).
        has_processors: The sampler's chain is not empty.
        keep_scores: The caller keeps the processed scores (`output_scores`): the fast path keeps none,
            so the step goes exact.
        keep_raw: The caller keeps a float32 copy of the logits (`output_logits`): no plain argmax.
    """
    if do_sample:
        return Route.FAST if fast and not keep_scores else Route.EXACT
    if has_processors or keep_scores or keep_raw:
        return Route.GREEDY
    return Route.ARGMAX
