"""A `StepTrace` as HTML: one column per stage (the input, then each processor), one row per rank.

Built with `el` only (`_views/html.py` escapes every text there). The display is a light card
with its own text colour, and every coloured cell sets its text colour too, so it reads in light
and dark notebook themes alike; it scrolls sideways rather than being cut when there are many
stages.

>>> import torch
>>> from hfbridge import explain_step
>>> step_html(explain_step(torch.tensor([0.0, 1.0, 2.0]), top_k=2)).startswith("<div class='hfbridge-step'")
True
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from hfbridge._views.html import BAR, CARD, CHOSEN, CHOSEN_BACKGROUND, MONO, MUTED, ROOT_STYLE, TEXT, Html, el, join
from hfbridge._views.step_record import WHYS

if TYPE_CHECKING:  # pragma: no cover
    from hfbridge._views.step_record import StepRecord

__all__ = ["step_html"]

# the chosen token's cell: a pair, like every colour here, and the views' blue outline
_CHOSEN = f"background:{CHOSEN_BACKGROUND};color:{TEXT};outline:2px solid {CHOSEN};outline-offset:-2px"
_STRIPES = ("#ffffff", "#f6f8fa")
_CELL = "text-align:left;white-space:nowrap;padding:1px 4px 1px 3px;vertical-align:top"
_WRAPPED = "text-align:left;padding:1px 4px 1px 3px;vertical-align:top;max-width:7em"  # "2008 scores (none shown)"
_WHY = f"{_WRAPPED};max-width:14em;font-size:90%;color:{MUTED};overflow-wrap:anywhere"  # a sampler's own reasons
# A token chip: its own colours and box, so that a notebook's `code` style (JupyterLab's dark theme
# gives `code` a dark grey background and light text) does not reach inside the light card.
_CHIP = f"font-family:{MONO};white-space:pre;background:transparent;color:inherit;padding:0;border:0;font-size:inherit"
# A header: wraps between the words of a long name (`<wbr>`), and anywhere in a long value.
_HEAD = ("text-align:left;vertical-align:top;padding:1px 4px 4px 3px;max-width:10em;overflow-wrap:anywhere;"
         "line-height:1.3")
_WORD = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _wrappable(name: str) -> Html:
    """`name` with a line-break opportunity between its CamelCase words (``Presence<wbr>Frequency``)."""
    return join(part for word in _WORD.split(name) for part in (Html("<wbr>"), word))


def step_html(trace: StepRecord) -> str:
    """The trace as one `<div>` with inline styles (what Jupyter shows)."""
    head = [el("th", "", style=f"{CARD}")]
    for number, stage in enumerate(trace.stages):
        params = stage.params_text
        head.append(el("th", f"[{number}] ", _wrappable(stage.short_name),
                       el("br") if params else None,
                       el("span", params, style="font-weight:normal;font-size:85%;white-space:normal") if params
                       else None,
                       style=f"{_HEAD};{CARD}"))
    depth = max(len(s.top_ids) for s in trace.stages)
    body = []
    for rank in range(depth):
        row = _STRIPES[rank % 2]
        cells = [el("td", rank + 1, style=f"text-align:right;color:{MUTED}")]
        for stage in trace.stages:
            if rank >= len(stage.top_ids):
                cells.append(el("td"))
                continue
            token_id, score, prob = stage.top_ids[rank], stage.top_scores[rank], stage.top_probs[rank]
            chosen = token_id == trace.token
            # An inline bar (not a CSS gradient) renders the same in every notebook front end.
            bar = el("span", style=f"display:inline-block;height:0.7em;width:{max(1, round(20 * prob))}px;"
                                   f"background:{CHOSEN if chosen else BAR};margin-left:3px")
            style = _CELL + (f";font-weight:bold;{_CHOSEN}" if chosen else "")
            cells.append(el(
                "td",
                el("code", trace.token_label(token_id), style=_CHIP),
                f" {prob:.3f}", bar,
                title=f"id {token_id}, score {score:.4f}", style=style))
        body.append(el("tr", *cells, style=f"background:{row};color:{TEXT}"))
    changed = ["" if s.changed is None else trace.changed_text(n).replace("changed ", "")
               for n, s in enumerate(trace.stages)]
    rows = [("possible", [str(s.possible) for s in trace.stages]),
            ("entropy", [f"{s.entropy:.3f}" for s in trace.stages]), ("changed", changed)]
    if any(stage.reasons for stage in trace.stages):  # DRY's repeats, XTC's coin, a thinking budget's forcing
        rows.append(("why", ["; ".join(trace.why(n, most=WHYS)) for n in range(len(trace.stages))]))
    for title, values in rows:
        body.append(el("tr", el("td", title, style=f"text-align:right;color:{MUTED};white-space:nowrap",
                               title="in nats" if title == "entropy" else None),
                       *(el("td", value, style=_CELL if title in ("possible", "entropy") else
                            _WRAPPED if title == "changed" else _WHY) for value in values),
                       style=f"border-top:1px solid #d0d7de;background:#ffffff;color:{TEXT}"))
    return el(
        "div",
        el("b", f"explain_step: {trace.summary()}"), el("br"),
        el("span", "each cell: token and probability (bar); hover a cell for the token's id and score; the chosen "
                   "token is outlined in blue; entropy in nats",
           style=f"font-size:85%;color:{MUTED}"),
        _table(head, body),
        class_="hfbridge-step",
        style=f"{ROOT_STYLE};{CARD};border:1px solid #d0d7de;border-radius:6px;padding:8px 12px;max-width:100%;"
              "overflow-x:auto;box-sizing:border-box",
    )


def _table(head: list[Html], body: list[Html]) -> Html:
    return el("table", el("thead", el("tr", *head)), el("tbody", *body),
              style=f"border-collapse:collapse;font-size:85%;margin-top:4px;{CARD}")
