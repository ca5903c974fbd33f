"""A `GenerationTrace` as HTML: the text coloured by probability, a legend and a table of steps.

Built with `el` only (`_views/html.py` escapes every text there). Long generations stay readable
and small: the table lists the uncertain steps by default (``table="all"`` for every step) and the
tooltips of a long text keep fewer alternatives.

>>> import torch
>>> from transformers.generation.utils import GenerateDecoderOnlyOutput
>>> from hfbridge import explain_generation
>>> scores = (torch.tensor([[0.0, 2.0, float("-inf")]]),)     # one step, vocabulary of 3
>>> trace = explain_generation(GenerateDecoderOnlyOutput(sequences=torch.tensor([[0, 1]]), scores=scores))
>>> html_fragment(trace).startswith("<div class='hfbridge-trace'")
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hfbridge._views.html import CARD, MONO, MUTED, ROOT_STYLE, TEXT, Html, el, join, page, prob_colour
from hfbridge._views.trace_view import summary

if TYPE_CHECKING:  # pragma: no cover
    from hfbridge._views.generation_record import GenerationRecord, TokenStep

__all__ = ["TABLES", "html_fragment", "html_page", "shown_steps"]

TABLES = ("uncertain", "all", "none")
UNCERTAIN_P = 0.5  # a step is uncertain when its token had p below this, or was not the most likely
MAX_ROWS = 100  # the uncertain table keeps at most this many steps (the least likely ones)
LONG = 300  # from this many steps on, tooltips keep 2 alternatives (the page grows gently)

_PADDING_STYLE = (f"font-family:{MONO};font-size:11px;color:{MUTED};background:#f6f8fa;border:1px dashed #8c959f;"
                  "border-radius:3px;padding:0 4px;margin-left:4px;white-space:nowrap")
_PADDING_BACKGROUND = "#e1e4e8"
_CHIP_STYLE = f"font-family:{MONO};font-size:11px;border:1px solid #8c959f;border-radius:3px;padding:0 3px"
# Token boundaries: an underline alternating between two greys (no glyph-like mark in the text).
_EDGES = ("#8c959f", "#d0d7de")  # 1px: a boundary, not an underline that reads as a link
_STRIPES = ("#ffffff", "#f6f8fa")


def check_table(table: object) -> str:
    if table not in TABLES:
        raise ValueError(f"table: expected one of {list(TABLES)}, got {table!r}")
    return str(table)


def html_fragment(trace: GenerationRecord, table: str = "uncertain") -> str:
    """The trace as one `<div>` with inline styles (what Jupyter shows)."""
    check_table(table)
    note = ("Each token's background is the probability it had in the distribution it was chosen from (after the "
            "logits processors); an alternating underline marks where tokens meet. Hover a token for its "
            "alternatives" + ("." if table == "none" else ", or open the table below."))
    return el(
        "div",
        el("div", summary(trace), style="font-weight:600"),
        el("div", note, style=f"color:{MUTED};font-size:12px;margin:2px 0 8px"),
        _flowing_text(trace), _legend(trace), _table(trace, table) if table != "none" else None,
        class_="hfbridge-trace",
        style=f"{ROOT_STYLE};{CARD};border:1px solid #d0d7de;border-radius:6px;padding:10px 14px;max-width:100%;"
              "overflow-x:auto;box-sizing:border-box",
    )


def html_page(trace: GenerationRecord, table: str = "uncertain") -> str:
    title = "explain_generation" + (f": {trace.prompt_text}" if trace.tokenizer is not None else "")
    return page(html_fragment(trace, table), title[:80])


def _flowing_text(trace: GenerationRecord) -> Html:
    parts: list[object] = []
    if trace.tokenizer is not None and trace.prompt_text:
        parts.append(el("span", trace.prompt_text, title="prompt", style=f"color:{MUTED}"))
    elif trace.tokenizer is None and trace.prompt_ids:
        parts.append(el("span", " ".join(map(str, trace.prompt_ids)) + " ", title="prompt", style=f"color:{MUTED}"))
    generated = trace.generated
    padding = [step for step in trace.steps if step.padding]
    alternatives = 2 if len(trace.steps) >= LONG else None
    for index, step in enumerate(generated):
        parts.append(_token(trace, step, _EDGES[index % 2], alternatives))
    if padding:
        label = trace.token_label(padding[0].token)
        count = len(padding)
        why = "its beam finished" if trace.beams else "the row finished"
        parts.append(el("span", f"+ {count} × {label} padding: {why}", title=_padding_tooltip(padding),
                        style=_PADDING_STYLE))
    scroll = "max-height:32em;overflow-y:auto;" if len(trace.steps) >= LONG else ""  # a long text scrolls in place
    return el("div", join(parts),
              style=f"font-size:15px;line-height:1.9;white-space:pre-wrap;overflow-wrap:anywhere;padding:6px 8px;"
                    f"border:1px solid #eaeef2;border-radius:4px;{scroll}{CARD}")


def _token(trace: GenerationRecord, step: TokenStep, edge: str, alternatives: int | None) -> Html:
    attributes = {"data_step": step.step, "title": tooltip(trace, step, alternatives)}
    colour = prob_colour(step.prob)
    edge_style = f"border-bottom:1px solid {edge}"
    # white is the card's own background: a confident token carries only its edge (a long page stays small)
    base = edge_style if colour == "#ffffff" else f"background:{colour};color:{TEXT};{edge_style}"
    if step.text is None:  # no tokenizer: ids
        return join([el("span", step.token, **attributes,
                        style=f"{base};font-family:{MONO};font-size:12px;padding:0 2px"), " "])
    if trace.is_special(step.token) or step.text == "" or not step.text.strip():
        # specials, empty and whitespace-only tokens as chips: visible, and clearly not text
        shown = step.text.replace("\n", "↵").replace(" ", "·") if step.text else trace.token_label(step.token)
        newline = "\n" if "\n" in step.text else ""
        return join([el("span", shown, **attributes, style=f"{base};{_CHIP_STYLE};margin:0 1px"), newline])
    # The highlight covers the token's text, not the space in front of it (" the" reads as " " + "the").
    body = step.text.lstrip()
    lead = step.text[: len(step.text) - len(body)]
    return join([lead, el("span", body, **attributes, style=base)])


def tooltip(trace: GenerationRecord, step: TokenStep, alternatives: int | None = None) -> str:
    model = f", model's own p = {step.model_prob:.3f}" if step.model_prob is not None else ""
    lines = [
        f"step {step.step}: {trace.token_label(step.token)}  p = {step.prob:.3f}{model}",
        f"rank {step.rank} of {step.possible} possible, entropy {step.entropy:.2f} nats",
        "alternatives:",
    ]
    for alternative in step.alternatives[:alternatives]:
        mark = "  <- chosen" if alternative.token == step.token else ""
        model_p = f"  (model {alternative.model_prob:.3f})" if alternative.model_prob is not None else ""
        lines.append(f"  {trace.token_label(alternative.token)}  {alternative.prob:.3f}{model_p}{mark}")
    return "\n".join(lines)


def _padding_tooltip(padding: list[TokenStep]) -> str:
    first, last = padding[0].step, padding[-1].step
    return (f"steps {first}-{last}: filler after this row finished (eos, a stop string, or its beam ended) while "
            "other rows went on; not generated by the model")


def _legend(trace: GenerationRecord) -> Html:
    chips = [el("span", label, style=f"display:inline-block;width:30px;text-align:center;background:{prob_colour(p)};"
                                     f"color:{TEXT};border:1px solid #d0d7de;margin-right:-1px")
             for p, label in ((0.0, "0"), (0.25, ".25"), (0.5, ".5"), (0.75, ".75"), (1.0, "1"))]
    padding: list[object] = []
    if any(step.padding for step in trace.steps):
        padding = ["   ", el("span", "dashed", style=_PADDING_STYLE), " padding after the row finished"]
    return el("div", "probability of the chosen token: ", *chips, *padding,
              style=f"font-size:11px;color:{MUTED};margin:6px 0 4px")


def shown_steps(trace: GenerationRecord, table: str) -> list[TokenStep]:
    """The table's steps: all, or the uncertain ones (at most `MAX_ROWS`, the least likely), in order."""
    if table == "all":
        return list(trace.steps)
    uncertain = [s for s in trace.steps if not s.padding and (s.prob < UNCERTAIN_P or s.rank > 1)]
    if len(uncertain) > MAX_ROWS:
        kept = {s.step for s in sorted(uncertain, key=lambda s: s.prob)[:MAX_ROWS]}
        uncertain = [s for s in uncertain if s.step in kept]
    return uncertain


def _table(trace: GenerationRecord, table: str) -> Html:
    cell = "text-align:left;padding:2px 8px;white-space:nowrap;vertical-align:top"
    number = "text-align:right;padding:2px 8px;white-space:nowrap;vertical-align:top;font-variant-numeric:tabular-nums"
    head = ["step", "token", "p"] + (["model p"] if trace.has_model else []) + ["rank", "possible", "entropy",
                                                                                 "alternatives (p)"]
    header = [el("th", h, style=f"{cell if h in ('token', 'alternatives (p)') else number};font-weight:600")
              for h in head]
    steps = shown_steps(trace, table)
    body = []
    for index, step in enumerate(steps):
        row_style = f"background:{_STRIPES[index % 2]};color:{MUTED if step.padding else TEXT}" + (
            ";font-style:italic" if step.padding else "")
        background = _PADDING_BACKGROUND if step.padding else prob_colour(step.prob)  # grey: no choice was made
        token = join([el("code", trace.token_label(step.token),
                         style=f"font-family:{MONO};white-space:pre;background:{background};color:{TEXT};"
                               "padding:0 2px;border-radius:2px"),
                      el("span", " padding", style="font-size:11px") if step.padding else None])
        cells = [el("td", step.step, style=number), el("td", token, style=cell), el("td", f"{step.prob:.3f}",
                                                                                    style=number)]
        if trace.has_model:
            cells.append(el("td", "" if step.model_prob is None else f"{step.model_prob:.3f}", style=number))
        cells += [el("td", step.rank, style=number), el("td", step.possible, style=number),
                  el("td", f"{step.entropy:.2f}", style=number),
                  el("td", _alternatives(trace, step, 3 if len(trace.steps) >= LONG else None), style=cell)]
        body.append(el("tr", *cells, style=row_style))
    count = len(trace.steps)
    if table == "all":
        title = f"Token by token: {count} step{'s' if count != 1 else ''}, the top alternatives of each"
    else:
        title = (f"The uncertain steps: {len(steps)} of {count} (p < {UNCERTAIN_P} or not the most likely token"
                 + (f"; the {MAX_ROWS} least likely" if len(steps) == MAX_ROWS else "")
                 + "); trace.html(table='all') lists every step")
    return el("details",
              el("summary", title, style="cursor:pointer;color:#0969da"),
              el("table", el("thead", el("tr", *header, style=f"border-bottom:1px solid #bdbdbd;{CARD}")),
                 el("tbody", *body), style=f"border-collapse:collapse;font-size:12px;margin-top:4px;{CARD}"),
              style="margin-top:6px")


def _alternatives(trace: GenerationRecord, step: TokenStep, most: int | None = None) -> Html:
    items = []
    for alternative in step.alternatives[:most]:
        chosen = alternative.token == step.token
        bar = el("span", style=f"display:inline-block;height:0.65em;width:{max(1, round(28 * alternative.prob))}px;"
                               f"background:{'#e6550d' if chosen else '#6baed6'};margin-left:3px")
        items.append(el("span", el("code", trace.token_label(alternative.token),  # own colours: see `step_html`
                                   style=f"font-family:{MONO};white-space:pre;background:transparent;color:inherit;"
                                         "padding:0;border:0;font-size:inherit"),
                        f" {alternative.prob:.2f}", bar,
                        style=("font-weight:700;" if chosen else "") + "margin-right:10px;white-space:nowrap"))
    return join(items)
