"""How a `GenerationTrace` is shown: a text table and a plot (its HTML: `trace_html.py`).

>>> import torch
>>> from transformers.generation.utils import GenerateDecoderOnlyOutput
>>> from hfbridge import explain_generation
>>> scores = (torch.tensor([[0.0, 2.0, float("-inf")]]),)     # one step, vocabulary of 3
>>> trace = explain_generation(GenerateDecoderOnlyOutput(sequences=torch.tensor([[0, 1]]), scores=scores))
>>> print(text_table(trace))
explain_generation: row 0 of 1, 1 generated token, ...
step  token         p  rank   left      H  alternatives
   0  #1        0.881     1      2   0.37  #0 0.12
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hfbridge._views.html import prob_colour

if TYPE_CHECKING:  # pragma: no cover
    from hfbridge._views.generation_record import GenerationRecord, TokenStep

_PADDING_BACKGROUND = "#e1e4e8"
LONG_PLOT = 300  # from this many steps on, the plot draws lines (bars would be a grey wall)


def _headline(trace: GenerationRecord) -> str:
    count = len(trace.generated)
    where = f"row {trace.row} of {trace.rows}" + (" (beam search)" if trace.beams else "")
    return f"{where}, {count} generated token{'s' if count != 1 else ''}"


def summary(trace: GenerationRecord) -> str:
    generated = trace.generated
    parts = [_headline(trace)]
    padding = len(trace.steps) - len(generated)
    if padding:
        parts.append(f"{padding} padding after the row finished")
    if generated:
        mean = sum(step.prob for step in generated) / len(generated)
        lowest = min(generated, key=lambda step: step.prob)
        parts.append(f"mean p {mean:.2f}")
        parts.append(f"lowest p {lowest.prob:.3f} at step {lowest.step} ({trace.token_label(lowest.token)})")
    return "explain_generation: " + ", ".join(parts)


# --- terminal ---------------------------------------------------------------------------------------


def text_table(trace: GenerationRecord) -> str:
    lines = [summary(trace)]
    if trace.tokenizer is not None:
        lines.append(f"prompt: {trace.prompt_text!r}")
        lines.append(f"text:   {trace.text!r}")
    lines.append("p: probability after the processors" + ("; [model]: under the model's own logits"
                                                         if trace.has_model else ""))
    width = min(16, max([8, *(len(trace.token_label(step.token)) for step in trace.steps)]))
    model_head = f"  {'[model]':>7}" if trace.has_model else ""
    lines.append("")
    lines.append(f"{'step':>4}  {'token':<{width}}  {'p':>5}{model_head}  {'rank':>4}  {'left':>5}  {'H':>5}  "
                 "alternatives")
    for step in trace.steps:
        label = _clip(trace.token_label(step.token), width)
        model = f"  [{step.model_prob:5.3f}]" if step.model_prob is not None else ("  " + " " * 7 if trace.has_model
                                                                                   else "")
        others = ", ".join(f"{_clip(trace.token_label(a.token), 12)} {a.prob:.2f}" for a in step.alternatives
                           if a.token != step.token)
        note = "  (padding: the row had finished)" if step.padding else ""
        note += "  (thinking)" if step.thinking else ""
        lines.append(f"{step.step:>4}  {label:<{width}}  {step.prob:5.3f}{model}  {step.rank:>4}  {step.possible:>5}  "
                     f"{step.entropy:5.2f}  {others}{note}")
    return "\n".join(lines)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# --- plot -------------------------------------------------------------------------------------------


def plot(trace: GenerationRecord, axes: Any = None) -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            "GenerationTrace.plot() needs matplotlib, which is not installed; "
            "install it with `pip install matplotlib` "
            "(or, in a clone of hfbridge, `pip install -e \".[notebooks]\"`)."
        ) from error
    steps = trace.steps
    created = axes is None
    long = len(steps) >= LONG_PLOT
    if created:
        width = min(14.0, max(6.0, 0.28 * len(steps) + 2.5))
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(width, 4.6), sharex=True,
                                          gridspec_kw={"height_ratios": [3, 2]})
    else:
        top, bottom = axes
        fig = top.figure
    x = list(range(len(steps)))
    probs = [step.prob for step in steps]
    if long:
        _plot_long(trace, top, bottom)
    else:
        colours = [_PADDING_BACKGROUND if step.padding else prob_colour(step.prob) for step in steps]
        top.bar(x, probs, color=colours, edgecolor="#57606a", linewidth=0.6, width=0.8,
                label="chosen token, after the processors")
        if trace.has_model:
            top.plot(x, [step.model_prob for step in steps], "o", color="#24292f", markersize=3.5,
                     label="same token, model's own distribution")
        bottom.plot(x, [step.entropy for step in steps], "-o", color="#0969da", markersize=3, linewidth=1.2,
                    label="after the processors")
        if trace.has_model:
            bottom.plot(x, [step.model_entropy for step in steps], "--", color="#6e7781", linewidth=1.0,
                        label="model's own")
    top.set_ylim(0, 1.05)
    top.set_ylabel("probability")
    bottom.set_ylabel("entropy (nats)")
    bottom.set_ylim(bottom=0)
    padding = [step.step for step in steps if step.padding]
    for ax in (top, bottom):
        ax.spines[["top", "right"]].set_visible(False)
        for first, last in _runs(padding):  # one span per run of padding, not one per step
            label = "padding (row finished)" if ax is top and first == padding[0] else None
            ax.axvspan(first - 0.5, last + 0.5, color="#f0f0f0", zorder=0, linewidth=0, label=label)
    handles, labels = top.get_legend_handles_labels()
    top.legend(handles[::-1], labels[::-1], loc="lower left", fontsize=8, frameon=False, ncol=3,
               bbox_to_anchor=(0.0, 1.0))
    bottom.legend(loc="upper right", fontsize=8, frameon=False, ncol=2)
    if steps and len(steps) <= 60:
        bottom.set_xticks(x)
        bottom.set_xticklabels([_tick(trace, step) for step in steps], rotation=90, fontsize=8,
                               fontfamily="monospace")
    else:
        bottom.set_xlabel("step")
    # Shorter than the summary (no padding count, no lowest p): the title must fit a narrow figure.
    title = _headline(trace)
    if trace.generated:
        title += f", mean p {sum(step.prob for step in trace.generated) / len(trace.generated):.2f}"
    top.set_title(f"explain_generation: {title}", fontsize=10, loc="left", pad=22)
    if created:
        fig.tight_layout()
        plt.close(fig)
    return fig


def _plot_long(trace: GenerationRecord, top: Any, bottom: Any) -> None:
    """Past a few hundred steps: every step as a faint dot, a rolling mean as a line, rare tokens marked."""
    steps = [step for step in trace.steps if not step.padding]
    x = [step.step for step in steps]
    probs = [step.prob for step in steps]
    window = max(5, len(steps) // 50)
    top.plot(x, probs, ".", color="#8c959f", markersize=2, alpha=0.6, label="chosen token, after the processors")
    top.plot(x, _rolling(probs, window), "-", color="#e6550d", linewidth=1.4, label=f"mean over {window} steps")
    rare = [step for step in steps if step.prob < 0.1]
    if rare:
        top.plot([s.step for s in rare], [s.prob for s in rare], "v", color="#b35806", markersize=3.5,
                 label="p < 0.1")
    entropy = [step.entropy for step in steps]
    bottom.plot(x, entropy, "-", color="#0969da", linewidth=0.5, alpha=0.35)
    bottom.plot(x, _rolling(entropy, window), "-", color="#0969da", linewidth=1.4,
                label=f"after the processors (mean over {window})")
    if trace.has_model:
        bottom.plot(x, _rolling([step.model_entropy or 0.0 for step in steps], window), "--", color="#6e7781",
                    linewidth=1.0, label="model's own")


def _rolling(values: list[float], window: int) -> list[float]:
    """The mean of the last `window` values at each position (fewer at the start)."""
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs `(first, last)` of sorted positions."""
    runs: list[tuple[int, int]] = []
    for position in positions:
        if runs and position == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], position)
        else:
            runs.append((position, position))
    return runs


def _tick(trace: GenerationRecord, step: TokenStep) -> str:
    if step.text is None:
        return str(step.token)
    # Spaces as middle dots: a rotated label with a leading blank reads as misplaced.
    return _clip(step.text.replace("\n", "↵").replace(" ", "·") or repr(step.text), 12)
