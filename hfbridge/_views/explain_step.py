"""What each logits processor did to one step's distribution: `explain_step` and its trace.

The trace is recorded by running the processors that `Sampler` built (HF's own, in HF's order)
one at a time on a copy of the scores, then choosing the token exactly as `Sampler` does, so
the recorded choice is the token `sample_step` returns for the same options and seed.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from hfbridge._step.checks.option_checks import check_tokenizer
from hfbridge._step.plan.guidance_processor import step_guidance
from hfbridge._step.plan.option_docs import fill_options
from hfbridge._step.plan.phase_options import PHASE_NAMES
from hfbridge._step.plan.processor_repr import processor_name as _processor_name
from hfbridge._step.plan.processor_repr import processor_params as _processor_params
from hfbridge._step.run.layout import from_rows
from hfbridge._step.run.sampler import Sampler
from hfbridge._views.html import page
from hfbridge._views.step_html import step_html
from hfbridge._views.step_plot import plot_step
from hfbridge._views.step_record import Stage, StepRecord

__all__ = ["Stage", "StepTrace", "explain_step", "record_step"]


class StepTrace(StepRecord):
    """The record `explain_step` returns; shows as a table in Jupyter and as text in a terminal.

    Attributes:
        stages: The input distribution, then one `Stage` per processor, in the order they ran.
        token: The token id chosen for the explained row.
        row: Which row of the batch is explained.
        batch_rows: How many rows the step had.
        do_sample: Whether the token was drawn (``True``) or taken by argmax (``False``).
        tokenizer: Used only to show tokens as text. Default: ``None`` (ids are shown).
        phase: With ``thinking_options``: the row's phase, ``"thinking"`` or ``"answer"``; else ``None``.
    """

    def _repr_html_(self) -> str:
        return step_html(self)

    def to_html(self) -> str:
        """A standalone HTML page (its own stylesheet): the table as Jupyter shows it, anywhere.

        >>> text = explain_step(torch.tensor([0.0, 1.0, 2.0]), top_k=2).to_html()
        >>> text.startswith("<!DOCTYPE html>"), "font-family" in text
        (True, True)
        """
        return page(self._repr_html_(), f"explain_step: {self.summary()}")

    def plot(self, *, top: int | None = None, ax: Any = None) -> Any:
        """Stacked bars: how the probability of the top tokens moves from stage to stage.

        Each bar is one stage; each coloured segment is one token (the input's top tokens, the
        last stage's top three and the chosen one), grey is every other token. The chosen token
        is hatched.

        Args:
            top: How many tokens get their own colour. Default: the trace's ``top`` (at most 10).
            ax: A matplotlib ``Axes`` to draw into. Default: a new figure.

        Returns:
            The matplotlib ``Figure``. A new figure is closed in pyplot, so in Jupyter it is
            shown once, when the call is the cell's last expression (or via ``display``).

        >>> import torch, matplotlib
        >>> matplotlib.use("Agg")
        >>> fig = explain_step(torch.tensor([0.0, 1.0, 2.0]), temperature=0.5).plot()
        >>> type(fig).__name__
        'Figure'
        """
        return plot_step(self, top=top, ax=ax)


def explain_step(
    logits: Any,
    input_ids: torch.Tensor | None = None,
    *,
    tokenizer: Any = None,
    top: int = 10,
    row: int = 0,
    **options: Any,
) -> StepTrace:
    """Run one `sample_step` and record what each logits processor did to one row.

    Takes exactly the arguments of `sample_step` (``temperature``, ``top_p``,
    ``repetition_penalty``, ``layout``, ``vocab_size``, ``generator``, ...), runs HF's processors
    one at a time in HF's order and records, for the input and after every processor: the
    processor's name and parameters, the ``top`` best tokens with scores and probabilities, how
    many tokens remain possible and the entropy; then the token chosen, which is the one
    `sample_step` returns for the same options and seed.

    Args:
        logits: Model output, as for `sample_step` (any layout, dtype or padded vocabulary).
        input_ids: ``(batch, seq)`` tokens so far, needed by penalties. Default: ``None``.
        tokenizer: A HF tokenizer to show tokens as text; without ``vocab_size``, the logits' columns
            from its size on are padding and dropped, as in `sample_step`. Default: ``None`` (ids are shown).
        top: How many tokens to record per stage. Default: ``10``.
        row: Which row of the batch to explain (rows as the layout flattens them). Default: ``0``.
        **options: Everything `sample_step` / `Sampler` accepts. Each processor runs once, so a
            stateful one passed in ``processors=`` (a grammar matcher) has taken one step
            afterwards: give `generate` a fresh one.
            [registry options]

    Returns:
        A `StepTrace`: rich HTML in Jupyter, a text table with ``print``, and ``.plot()``.

    >>> import torch
    >>> trace = explain_step(torch.tensor([[0.0, 1.0, 3.0, 2.0]]), temperature=0.5, top_k=2)
    >>> [stage.name for stage in trace.stages]
    ['input', 'TemperatureLogitsWarper', 'TopKLogitsWarper']
    >>> trace.stages[-1].possible
    2
    """
    return record_step(logits, input_ids, tokenizer=tokenizer, top=top, row=row, **options)[0]


explain_step.__doc__ = fill_options(explain_step.__doc__)  # the registry's options, listed in help()


def record_step(logits: Any, input_ids: torch.Tensor | None = None, *, tokenizer: Any = None, top: int = 10,
                row: int = 0, **options: Any) -> tuple[StepTrace, torch.Tensor]:
    """`explain_step`'s trace and the step's tokens for the whole batch, shaped as `sample_step` returns them."""
    check_tokenizer(tokenizer)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top: expected a positive int (tokens to record per stage), got {top!r}")
    if isinstance(row, bool) or not isinstance(row, int):
        raise TypeError(f"row: expected an int (which batch row to explain), got {type(row).__name__}")
    if "unconditional_logits" in options:  # sample_step's guidance argument, as a Sampler takes it
        unconditional = options.pop("unconditional_logits")
        options.update(step_guidance(unconditional))
    sampler = Sampler(tokenizer=tokenizer, **options)  # the tokenizer also serves DRY's string breakers
    # The step's own preparation, so batch shapes and errors are `sample_step`'s.
    view, ids, batch_shape = sampler.prepare(logits, input_ids)  # [N, V] view of the logits, [N, T]
    rows = view.to(dtype=torch.float32, copy=True)  # [N, V]
    n_rows = rows.shape[0]
    if not 0 <= row < n_rows:
        raise ValueError(f"row: got {row}, expected 0 <= row < {n_rows} (the step has {n_rows} row(s))")
    phase = None
    do_sample = bool(sampler.do_sample)
    if sampler.phased:  # `thinking_options`: the row's own phase, its own processors
        traces, tokens, phases, samples = sampler.explain_phases(ids, view)
        trace, phase, do_sample = traces[row], PHASE_NAMES[phases[row]], samples[row]
    else:
        outputs, tokens = sampler.explain(ids, view)  # the step's own token, for the same options and seed
        trace = [(processor, scores[row]) for processor, scores in outputs]
    stages = [_stage("input", {}, rows[row], top, None)]
    for processor, scores in trace:
        reasons = () if phase is not None else _reasons(processor, ids, row)
        stages.append(_stage(_processor_name(processor), _processor_params(processor), scores, top,
                             stages[-1].scores, reasons))
    recorded = StepTrace(
        stages=stages,
        token=int(tokens[row]),
        row=row,
        batch_rows=n_rows,
        do_sample=do_sample,
        tokenizer=tokenizer,
        phase=phase,
    )
    return recorded, (tokens if len(batch_shape) == 1 else from_rows(tokens, batch_shape))  # as `Sampler.__call__`


def _reasons(processor: Any, ids: torch.Tensor | None, row: int) -> tuple[Any, ...]:
    """Why `processor` did what it did to `row`, from its ``describe_last`` (DRY, XTC, a thinking budget): a trait
    of the class, asked only here, after the step. A per-row split of one's rows (a generator per row) says None."""
    describe = getattr(processor, "describe_last", None)
    if describe is None or not callable(describe) or (ids is None and _needs_ids(describe)):
        return ()
    found = describe(ids)[row]
    if found is None:
        return ()
    return tuple(found) if isinstance(found, list) else (found,)


def _needs_ids(describe: Any) -> bool:
    parameter = next(iter(inspect.signature(describe).parameters.values()), None)
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _stage(name: str, params: dict[str, Any], scores: torch.Tensor, top: int,
           previous: torch.Tensor | None, reasons: tuple[Any, ...] = ()) -> Stage:
    scores = scores.detach().float().cpu().clone()  # [V]
    # NaN never equals itself: a NaN kept in place is no change
    changed = None
    if previous is not None:
        changed = int((torch.ne(scores, previous) & ~(scores.isnan() & previous.isnan())).sum())
    probs = torch.softmax(scores, dim=-1)
    possible = int((scores > float("-inf")).sum())
    # Removed tokens (-inf) are not listed: `possible` already says how many are left.
    top_scores, top_ids = torch.topk(scores, max(1, min(top, possible)))
    return Stage(
        name=name,
        params=params,
        scores=scores,
        top_ids=top_ids.tolist(),
        top_scores=top_scores.tolist(),
        top_probs=probs[top_ids].tolist(),
        possible=possible,
        entropy=float(torch.special.entr(probs).sum()),
        changed=changed,
        reasons=reasons,
    )
