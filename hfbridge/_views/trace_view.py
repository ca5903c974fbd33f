"""How a `GenerationTrace` is shown: a text table, an HTML fragment (Jupyter), a page, a plot.

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

from hfbridge._views.html import MONO, ROOT_STYLE, escape, page, prob_colour

if TYPE_CHECKING:  # pragma: no cover
    from hfbridge._views.explain_generation import GenerationTrace, TokenStep

_TEXT_COLOUR = "#1f2328"
_MUTED = "#57606a"
_PADDING_STYLE = (f"font-family:{MONO};font-size:11px;color:#6e7781;background:#f6f8fa;border:1px dashed #8c959f;"
                  "border-radius:3px;padding:0 4px;margin-left:2px;white-space:nowrap")
_PADDING_BACKGROUND = "#e1e4e8"
_CHIP_STYLE = f"font-family:{MONO};font-size:11px;border:1px solid #8c959f;border-radius:3px;padding:0 3px"


def _headline(trace: GenerationTrace) -> str:
    count = len(trace.generated)
    where = f"row {trace.row} of {trace.rows}" + (" (beam search)" if trace.beams else "")
    return f"{where}, {count} generated token{'s' if count != 1 else ''}"


def _summary(trace: GenerationTrace) -> str:
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


def text_table(trace: GenerationTrace) -> str:
    lines = [_summary(trace)]
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
        lines.append(f"{step.step:>4}  {label:<{width}}  {step.prob:5.3f}{model}  {step.rank:>4}  {step.possible:>5}  "
                     f"{step.entropy:5.2f}  {others}{note}")
    return "\n".join(lines)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# --- HTML -------------------------------------------------------------------------------------------


def html_fragment(trace: GenerationTrace) -> str:
    """The trace as one `<div>` with inline styles (what Jupyter shows)."""
    return (
        f"<div class='hfbridge-trace' style='{ROOT_STYLE};color:{_TEXT_COLOUR};background:#ffffff;"
        "border:1px solid #d0d7de;border-radius:6px;padding:10px 14px;max-width:100%;overflow-x:auto'>"
        f"<div style='font-weight:600'>{escape(_summary(trace))}</div>"
        f"<div style='color:{_MUTED};font-size:12px;margin:2px 0 8px'>Each token's background is the probability it "
        f"had in the distribution it was chosen from (after the logits "
        "processors); hover a token for its alternatives, or open the table below.</div>"
        f"{_flowing_text(trace)}{_legend(trace)}{_table(trace)}</div>"
    )


def html_page(trace: GenerationTrace) -> str:
    title = "explain_generation" + (f": {trace.prompt_text}" if trace.tokenizer is not None else "")
    return page(html_fragment(trace), title[:80])


def _flowing_text(trace: GenerationTrace) -> str:
    parts = []
    if trace.tokenizer is not None and trace.prompt_text:
        parts.append(f"<span title='prompt' style='color:{_MUTED}'>{escape(trace.prompt_text)}</span>")
    elif trace.tokenizer is None and trace.prompt_ids:
        ids = escape(" ".join(map(str, trace.prompt_ids)))
        parts.append(f"<span title='prompt' style='color:{_MUTED}'>{ids} </span>")
    generated = [step for step in trace.steps if not step.padding]
    padding = [step for step in trace.steps if step.padding]
    for step in generated:
        parts.append(_token_span(trace, step))
    if padding:
        parts.append(
            f"<span title='{escape(_padding_tooltip(trace, padding))}' style='{_PADDING_STYLE}'>+ {len(padding)} "
            f"padding {trace.token_label(padding[0].token) if trace.tokenizer is not None else ''}"
            f"{' (beam finished)' if trace.beams else ' (row finished)'}</span>"
        )
    return (f"<div style='font-size:15px;line-height:1.9;white-space:pre-wrap;word-wrap:break-word;"
            f"padding:6px 8px;border:1px solid #eaeef2;border-radius:4px;background:#ffffff'>{''.join(parts)}</div>")


def _token_span(trace: GenerationTrace, step: TokenStep) -> str:
    background = prob_colour(step.prob)
    attributes = f"data-step='{step.step}' title='{escape(_tooltip(trace, step))}'"
    base = (f"background:{background};color:{_TEXT_COLOUR};border-radius:3px;"
            "box-shadow:inset -1px 0 0 rgba(31,35,40,0.3)")
    if step.text is None:  # no tokenizer: ids
        style = f"{base};font-family:{MONO};font-size:12px;padding:0 3px"
        return f"<span {attributes} style='{style}'>{step.token}</span> "
    if trace.is_special(step.token) or step.text == "":
        shown = escape(step.text or trace.token_label(step.token))
        return f"<span {attributes} style='{base};{_CHIP_STYLE};margin-left:2px'>{shown}</span>"
    text = escape(step.text)
    if "\n" in step.text:  # a newline token: a visible mark, then the line break itself
        text = text.replace("\n", f"<span style='color:{_MUTED}'>↵</span>\n")
    return f"<span {attributes} style='{base}'>{text}</span>"


def _tooltip(trace: GenerationTrace, step: TokenStep) -> str:
    model = f", model's own p = {step.model_prob:.3f}" if step.model_prob is not None else ""
    lines = [
        f"step {step.step}: {trace.token_label(step.token)}  p = {step.prob:.3f}{model}",
        f"rank {step.rank} of {step.possible} possible, entropy {step.entropy:.2f} nats",
        "alternatives:",
    ]
    for alternative in step.alternatives:
        mark = "  <- chosen" if alternative.token == step.token else ""
        model_p = f"  (model {alternative.model_prob:.3f})" if alternative.model_prob is not None else ""
        lines.append(f"  {trace.token_label(alternative.token)}  {alternative.prob:.3f}{model_p}{mark}")
    return "\n".join(lines)


def _padding_tooltip(trace: GenerationTrace, padding: list[TokenStep]) -> str:
    first, last = padding[0].step, padding[-1].step
    return (f"steps {first}-{last}: filler after this row finished (eos, a stop string, or its beam ended) while "
            "other rows went on; not generated by the model")


def _legend(trace: GenerationTrace) -> str:
    chips = "".join(
        f"<span style='display:inline-block;width:30px;text-align:center;background:{prob_colour(p)};"
        f"color:{_TEXT_COLOUR};border:1px solid #d0d7de;margin-right:-1px'>{label}</span>"
        for p, label in ((0.0, "0"), (0.25, ".25"), (0.5, ".5"), (0.75, ".75"), (1.0, "1"))
    )
    padding = (f" &nbsp; <span style='{_PADDING_STYLE}'>dashed</span> padding after the row finished"
               if any(step.padding for step in trace.steps) else "")
    return (f"<div style='font-size:11px;color:{_MUTED};margin:6px 0 4px'>probability of the chosen token: "
            f"{chips}{padding}</div>")


def _table(trace: GenerationTrace) -> str:
    cell = "text-align:left;padding:2px 8px;white-space:nowrap;vertical-align:top"
    number = "text-align:right;padding:2px 8px;white-space:nowrap;vertical-align:top;font-variant-numeric:tabular-nums"
    head = ["step", "token", "p"] + (["model p"] if trace.has_model else []) + ["rank", "possible", "entropy",
                                                                                 "alternatives (p)"]
    header = "".join(f"<th style='{cell if h in ('token', 'alternatives (p)') else number};font-weight:600'>{h}</th>"
                     for h in head)
    body = []
    for step in trace.steps:
        row_style = f"color:{_MUTED};font-style:italic" if step.padding else ""
        background = _PADDING_BACKGROUND if step.padding else prob_colour(step.prob)  # grey: no choice was made
        token = (f"<code style='font-family:{MONO};white-space:pre;background:{background};"
                 f"color:{_TEXT_COLOUR};padding:0 2px;border-radius:2px'>{escape(trace.token_label(step.token))}</code>"
                 + (" <span style='font-size:11px'>padding</span>" if step.padding else ""))
        cells = [f"<td style='{number}'>{step.step}</td>", f"<td style='{cell}'>{token}</td>",
                 f"<td style='{number}'>{step.prob:.3f}</td>"]
        if trace.has_model:
            cells.append(f"<td style='{number}'>{_optional(step.model_prob)}</td>")
        cells += [f"<td style='{number}'>{step.rank}</td>", f"<td style='{number}'>{step.possible}</td>",
                  f"<td style='{number}'>{step.entropy:.2f}</td>",
                  f"<td style='{cell}'>{_alternatives(trace, step)}</td>"]
        body.append(f"<tr style='{row_style}'>{''.join(cells)}</tr>")
    count = len(trace.steps)
    return (
        f"<details style='margin-top:6px'><summary style='cursor:pointer;color:#0969da'>Token by token: {count} "
        f"step{'s' if count != 1 else ''}, the top alternatives of each</summary>"
        "<table style='border-collapse:collapse;font-size:12px;margin-top:4px'>"
        f"<thead><tr style='border-bottom:1px solid #bdbdbd'>{header}</tr></thead><tbody>{''.join(body)}</tbody>"
        "</table></details>"
    )


def _alternatives(trace: GenerationTrace, step: TokenStep) -> str:
    items = []
    for alternative in step.alternatives:
        chosen = alternative.token == step.token
        bar = (f"<span style='display:inline-block;height:0.65em;width:{max(1, round(28 * alternative.prob))}px;"
               f"background:{'#e6550d' if chosen else '#6baed6'};margin-left:3px'></span>")
        weight = "font-weight:700;" if chosen else ""
        items.append(f"<span style='{weight}margin-right:10px;white-space:nowrap'><code style='font-family:{MONO};"
                     f"white-space:pre'>{escape(trace.token_label(alternative.token))}</code> "
                     f"{alternative.prob:.2f}{bar}</span>")
    return "".join(items)


def _optional(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


# --- plot -------------------------------------------------------------------------------------------


def plot(trace: GenerationTrace, axes: Any = None) -> Any:
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
    if created:
        width = min(14.0, max(6.0, 0.28 * len(steps) + 2.5))
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(width, 4.6), sharex=True,
                                          gridspec_kw={"height_ratios": [3, 2]})
    else:
        top, bottom = axes
        fig = top.figure
    x = list(range(len(steps)))
    first_padding = next((step for step in steps if step.padding), None)
    probs = [step.prob for step in steps]
    colours = [_PADDING_BACKGROUND if step.padding else prob_colour(step.prob) for step in steps]
    top.bar(x, probs, color=colours, edgecolor="#57606a", linewidth=0.6, width=0.8,
            label="chosen token, after the processors")
    if trace.has_model:
        top.plot(x, [step.model_prob for step in steps], "o", color="#24292f", markersize=3.5,
                 label="same token, model's own distribution")
    top.set_ylim(0, 1.05)
    top.set_ylabel("probability")
    bottom.plot(x, [step.entropy for step in steps], "-o", color="#0969da", markersize=3, linewidth=1.2,
                label="after the processors")
    if trace.has_model:
        bottom.plot(x, [step.model_entropy for step in steps], "--", color="#6e7781", linewidth=1.0,
                    label="model's own")
    bottom.set_ylabel("entropy (nats)")
    bottom.set_ylim(bottom=0)
    for ax in (top, bottom):
        ax.spines[["top", "right"]].set_visible(False)
        for step in steps:
            if step.padding:
                label = "padding (row finished)" if ax is top and step is first_padding else None
                ax.axvspan(step.step - 0.5, step.step + 0.5, color="#f0f0f0", zorder=0, linewidth=0, label=label)
    handles, labels = top.get_legend_handles_labels()
    top.legend(handles[::-1], labels[::-1], loc="lower left", fontsize=8, frameon=False, ncol=2,
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


def _tick(trace: GenerationTrace, step: TokenStep) -> str:
    if step.text is None:
        return str(step.token)
    # Spaces as middle dots: a rotated label with a leading blank reads as misplaced.
    return _clip(step.text.replace("\n", "↵").replace(" ", "·") or repr(step.text), 12)
