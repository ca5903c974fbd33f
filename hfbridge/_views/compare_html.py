"""A comparison of settings as HTML: one column per setting, side by side.

Built with `el` only (`_views/html.py` escapes every text there). The colours are the views' own
(docs/views.md): the chosen token outlined in blue, a removed token struck through in red, a token's
background its probability (white: likely, orange: a long shot). A long generation stays readable: the
text the settings share is shown once (its end, the rest folded), and each setting's own text scrolls
in its column.

>>> import torch
>>> from hfbridge import compare_step
>>> result = compare_step(torch.tensor([[1.0, 0.0]]), None, {"a": {}, "b": dict(top_k=1)})
>>> step_html(result).startswith("<div class='hfbridge-compare'")
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hfbridge._views.comparison_record import SHOWN, options_text
from hfbridge._views.html import CARD, CHOSEN, MONO, MUTED, REMOVED, ROOT_STYLE, Html, el, join, prob_colour
from hfbridge._views.step_record import WHYS

if TYPE_CHECKING:  # pragma: no cover
    from hfbridge._views.comparison_record import GenerationComparisonRecord, StepComparisonRecord

__all__ = ["generation_html", "step_html"]

SHARED_CHARS = 600  # the shared text shows its last characters; the rest is folded
# Explicit colours on a light card in every theme (`CARD` keeps a browser's forced dark mode off it).
_ROOT = (f"{ROOT_STYLE};{CARD};border:1px solid #d0d7de;"
         "border-radius:6px;padding:10px 14px;max-width:100%;box-sizing:border-box")
_CHIP = (f"font-family:{MONO};font-size:11px;border-radius:3px;padding:0 3px;margin-right:3px;white-space:pre;"
         "color:#1f2328")


def _grid(count: int) -> str:
    width = "minmax(0,1fr)" if count <= 3 else "minmax(260px,1fr)"
    return f"display:grid;grid-template-columns:repeat({min(count, 3)},{width});gap:10px;margin-top:8px"


_COLUMN = "border:1px solid #d0d7de;border-radius:6px;padding:8px 10px;min-width:0;background:#ffffff"


def _chip(text: str, *, prob: float | None = None, chosen: bool = False, removed: bool = False,
          title: str | None = None) -> Html:
    if removed:
        colours = f"background:{REMOVED[0]};color:{REMOVED[1]};text-decoration:line-through;border:1px solid #ffcecb"
    else:
        background = "#ffffff" if prob is None else prob_colour(prob)
        colours = f"background:{background};border:1px solid {'#8c959f' if not chosen else CHOSEN}"
    outline = f";outline:2px solid {CHOSEN};outline-offset:0" if chosen else ""
    return el("span", text, style=f"{_CHIP};{colours}{outline}", title=title)


def _header(name: str, options: dict) -> Html:
    return join([el("div", name, style="font-weight:600;font-size:14px"),
                 el("div", options_text(options), style=f"font-family:{MONO};font-size:11px;color:{MUTED};"
                                                         "overflow-wrap:anywhere;margin-bottom:4px")])


def _text(record: StepComparisonRecord | GenerationComparisonRecord, token: int) -> str:
    return f"#{token}" if record.tokenizer is None else record.tokenizer.decode([token])


def _tokens(record: StepComparisonRecord | GenerationComparisonRecord, tokens: list[int], *,
            removed: bool = False) -> Html:
    chips = [_chip(_text(record, token), removed=removed) for token in tokens[:SHOWN]]
    more = len(tokens) - SHOWN
    return join([*chips, el("span", f" +{more} more", style=f"color:{MUTED}") if more > 0 else None])


def step_html(record: StepComparisonRecord) -> str:
    """`compare_step`'s result as one `<div>`."""
    note = ("Each column is one setting, run from the same generator state. Per stage: how many candidates it "
            "removed, and those another setting keeps to the end (struck through). Below, the tokens left, "
            "coloured by probability; the chosen one outlined.")
    columns = []
    differences = record.differences
    for name, trace in record.traces.items():
        final = trace.stages[-1]
        probs = final.probs()
        stages = []
        for number in range(1, len(trace.stages)):
            stage = trace.stages[number]
            found = next((d for d in differences if d.setting == name and d.stage == number), None)
            line = [el("span", stage.label, style="font-weight:600;overflow-wrap:anywhere"),
                    el("span", f" · {stage.possible} left · {trace.changed_text(number)}", style=f"color:{MUTED}")]
            kept = [el("div", "why: ", reason, style=f"color:{MUTED};font-size:12px;overflow-wrap:anywhere")
                    for reason in trace.why(number, most=WHYS)]  # DRY's repeat, XTC's coin, a thinking budget's forcing
            kept += [] if found is None else [
                el("div", f"removed {len(found.removed)}; {other} keeps ", _tokens(record, tokens, removed=True))
                for other, tokens in found.kept_by.items() if tokens]
            if record.first_difference is not None:  # why the tokens differ: what this stage did to the chosen ones
                kept += [el("div", _chip(_text(record, token), prob=after), f" p {before:.3f} → {after:.3f}")
                         for token, before, after in record.moves(name, number)]
            stages.append(el("li", *line, *kept, style="margin:2px 0"))
        top = [join([_chip(_text(record, token), prob=float(probs[token]), chosen=token == trace.token,
                           title=f"p={float(probs[token]):.3f}"),
                     el("span", f"{float(probs[token]):.2f} ", style=f"color:{MUTED};font-size:11px")])
               for token in final.top_ids]
        chosen_p = float(probs[trace.token])
        columns.append(el(
            "div", _header(name, record.settings[name]),
            el("div", "chose ", _chip(_text(record, trace.token), prob=chosen_p, chosen=True),
               f" p={chosen_p:.3f} · {final.possible} candidates left", style="margin:2px 0 4px"),
            el("ol", *stages, start="1", style="margin:0 0 4px;padding-left:20px") if stages else
            el("div", "no processor", style=f"color:{MUTED}"),
            el("div", "top after the last stage: ", join(top), style="line-height:1.9"),
            style=_COLUMN))
    return el("div", el("div", record.summary(), style="font-weight:600"),
              el("div", note, style=f"color:{MUTED};font-size:12px;margin:2px 0 4px"),
              el("div", *columns, style=_grid(len(columns))),
              class_="hfbridge-compare", style=_ROOT)


def _flow(record: GenerationComparisonRecord, name: str, start: int) -> Html:
    """The setting's own text from ``start`` on: each token's background its probability, hover for more."""
    spans = []
    for step in record.traces[name].steps[start:]:
        text = step.text if step.text is not None else f"#{step.token} "
        tip = f"step {step.step}: p={step.prob:.3f}, rank {step.rank}" + (" (padding)" if step.padding else "")
        spans.append(el("span", text, style=f"background:{prob_colour(step.prob)}" if step.prob < 0.995 else None,
                        title=tip))
    return el("div", *spans, style=f"font-family:{MONO};font-size:12px;white-space:pre-wrap;overflow-wrap:anywhere;"
                                   "max-height:28em;overflow-y:auto;border-top:1px solid #d0d7de;padding-top:4px;"
                                   "color:#1f2328")


def _shared(record: GenerationComparisonRecord, upto: int | None) -> Html:
    """The prompt and the tokens every setting shares, once: its end shown, the rest folded."""
    name = next(iter(record.traces))
    tokens = record.tokens[name][record.row]
    end = record.prompt_length + (upto if upto is not None else tokens.shape[0] - record.prompt_length)
    ids = tokens[:end].tolist()
    text = " ".join(map(str, ids)) if record.tokenizer is None else record.tokenizer.decode(ids)
    style = f"font-family:{MONO};font-size:12px;white-space:pre-wrap;overflow-wrap:anywhere;color:#1f2328"
    if len(text) <= SHARED_CHARS:
        return el("div", text, style=style)
    cut = len(text) - SHARED_CHARS
    cut = next((i + 1 for i in range(cut, min(cut + 40, len(text))) if text[i].isspace()), cut)  # at a space
    return el("div", el("details", el("summary", f"… {cut:,} earlier characters", style=f"color:{MUTED}"),
                        text[:cut]), text[cut:], style=style)


def generation_html(record: GenerationComparisonRecord) -> str:
    """`compare_generation`'s result as one `<div>`."""
    step = record.row_difference
    note = ("Every setting ran from the same generator state. Above: the prompt and the tokens they share. Each "
            "column: where that setting parts from the others, the candidates no other setting allowed there, "
            "and its text from there (background: the token's probability; hover a token).")
    columns = []
    for name, trace in record.traces.items():
        parts: list[object] = [_header(name, record.settings[name])]
        if step is not None and step < len(trace.steps):
            at = trace.steps[step]
            only = record.only_in(name, step)
            parts.append(el("div", f"step {step}: ", _chip((at.text or f"#{at.token}"), prob=at.prob, chosen=True),
                            f" p={at.prob:.3f}, rank {at.rank} · {at.possible} candidates",
                            style="margin:2px 0"))
            if only:
                parts.append(el("div", f"{len(only)} no other setting allowed: ", _tokens(record, only),
                                style="margin:2px 0;line-height:1.9"))
            for other, token, p in record.others_chosen(name, step):  # why: how likely the other's token was here
                parts.append(el("div", f"{other}'s ", _chip(_text(record, token), prob=p), f" had p={p:.3f} here",
                                style="margin:2px 0"))
            for reason in record.why(name):  # why, in the sampler's own terms: DRY's repeat, the budget's forcing
                parts.append(el("div", "why: ", reason, style=f"color:{MUTED};font-size:12px;overflow-wrap:anywhere"))
        elif step is not None:
            parts.append(el("div", f"ended before step {step}", style=f"color:{MUTED}"))
        for line in record.rolled_back(name):  # why, for a ban: which ban took back which steps
            parts.append(el("div", "rolled back: ", line, style=f"color:{MUTED};font-size:12px;overflow-wrap:anywhere"))
        parts.append(_flow(record, name, step if step is not None else len(trace.steps)))
        columns.append(el("div", *parts, style=_COLUMN))
    return el("div", el("div", record.summary(), style="font-weight:600"),
              el("div", note, style=f"color:{MUTED};font-size:12px;margin:2px 0 6px"),
              _shared(record, step),
              el("div", *columns, style=_grid(len(columns))),
              class_="hfbridge-compare", style=_ROOT)
