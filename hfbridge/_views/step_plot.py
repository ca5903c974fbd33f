"""`StepTrace.plot()`: stacked bars of how the top tokens' probability moves from stage to stage.

>>> import torch, matplotlib
>>> matplotlib.use("Agg")
>>> from hfbridge import explain_step
>>> type(plot_step(explain_step(torch.tensor([0.0, 1.0, 2.0]), temperature=0.5))).__name__
'Figure'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from hfbridge._views.html import CHOSEN

if TYPE_CHECKING:
    from hfbridge._views.step_record import Stage, StepRecord

__all__ = ["plot_step"]


def plot_step(trace: StepRecord, *, top: int | None = None, ax: Any = None) -> Any:
    """`StepTrace.plot` (see there): the matplotlib `Figure`, a new one closed in pyplot unless `ax` is given."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            "StepTrace.plot() needs matplotlib, which is not installed; "
            "install it with `pip install matplotlib` "
            "(or, in a clone of hfbridge, `pip install -e \".[notebooks]\"`)."
        ) from error
    count = min(top if top is not None else len(trace.stages[0].top_ids), 10)
    if count < 1:
        raise ValueError(f"top: expected a positive number of tokens to plot, got {top!r}")
    # The input's leaders, plus whatever the processors promoted to the top, plus the choice.
    tokens = list(trace.stages[0].top_ids[:count])
    for token_id in [*trace.stages[-1].top_ids[: min(count, 3)], trace.token]:
        if token_id not in tokens:
            tokens.append(token_id)
    probs = torch.stack([s.probs() for s in trace.stages])  # [stages, vocab]
    shown = probs[:, tokens]  # [stages, tokens]
    rest = (1.0 - shown.sum(dim=1)).clamp_min(0.0)

    created = ax is None
    if created:
        fig, ax = plt.subplots(figsize=(1.9 * len(trace.stages) + 3.2, 4.2))
    else:
        fig = ax.figure
    x = range(len(trace.stages))
    bottom = torch.zeros(len(trace.stages))
    colors = plt.get_cmap("tab10" if len(tokens) <= 10 else "tab20")
    for i, token_id in enumerate(tokens):
        chosen = token_id == trace.token
        ax.bar(
            x, shown[:, i].tolist(), bottom=bottom.tolist(), color=colors(i % colors.N), width=0.6,
            edgecolor=CHOSEN if chosen else "white", linewidth=1.6 if chosen else 0.5,  # the views' blue
            hatch="//" if chosen else None,
            label=trace.token_label(token_id) + ("  (chosen)" if chosen else ""),
        )
        bottom += shown[:, i]
    ax.bar(x, rest.tolist(), bottom=bottom.tolist(), color="#d9d9d9", width=0.6, edgecolor="white",
           linewidth=0.5, label="all other tokens")
    for i, stage in enumerate(trace.stages):
        ax.text(i, 1.01, f"{stage.possible} possible\nH={stage.entropy:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels([_wrap_label(s) for s in trace.stages], fontsize=8)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("probability")
    ax.spines[["top", "right"]].set_visible(False)
    where = f"row {trace.row} of {trace.batch_rows}: " if trace.batch_rows > 1 else ""
    ax.set_title(f"explain_step: {where}token {trace.token_label(trace.token)} "
                 f"{'sampled' if trace.do_sample else 'taken greedily'}", fontsize=10, pad=24)
    handles, labels = ax.get_legend_handles_labels()
    # Listed top-down in the order the segments are stacked, so legend and bars read alike.
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False, title="token")
    if created:
        fig.tight_layout()
        plt.close(fig)
    return fig


def _wrap_label(stage: Stage) -> str:
    params = stage.params_text
    if len(params) > 22:
        params = params[:21] + "…"
    return f"{stage.short_name}\n{params}" if params else stage.short_name

