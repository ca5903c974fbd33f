"""Shared HTML pieces for hfbridge's displays: the one HTML builder, fonts, colours, standalone pages.

Every view builds its HTML with `el` (an element) and `Html` (markup already built): any `str`
given to `el`, as a child or as an attribute value, is escaped here and nowhere else, so a token
that decodes to `<script>` is shown as text in every view. Colours come in pairs (`PAIR_*`: a
background and its text colour), so a view reads the same in a light and a dark notebook theme.

A display has two forms. In a notebook, `_repr_html_` returns a fragment whose root element
carries its font inline, because notebook front ends keep only inline styles reliably (GitHub's
viewer drops `<style>` blocks). Outside a notebook, `page` wraps the same fragment in a complete
document with its own stylesheet, so a saved file looks like the notebook and not like a bare
browser default (serif text, tables without padding).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable

__all__ = [
    "BAR",
    "CARD",
    "CHOSEN",
    "CHOSEN_BACKGROUND",
    "FONT",
    "FONT_STYLE",
    "MONO",
    "MUTED",
    "REMOVED",
    "ROOT_STYLE",
    "TEXT",
    "Html",
    "el",
    "escape",
    "join",
    "page",
    "prob_colour",
]

# System UI fonts first (what Jupyter itself uses), then common sans-serif fallbacks.
FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", sans-serif'
MONO = 'ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", "Liberation Mono", monospace'
FONT_STYLE = f"font-family:{FONT}"
# The root element of every display: the font travels with the fragment, wherever it is shown.
ROOT_STYLE = f"{FONT_STYLE};font-size:13px;line-height:1.45"

# The look of a notebook's output area for tables (JupyterLab's defaults, approximately).
_PAGE_CSS = f"""
html {{ background: #ffffff; }}
body {{ font-family: {FONT}; font-size: 13px; line-height: 1.45; color: #1f2328;
        margin: 24px auto; max-width: 1100px; padding: 0 16px; }}
code, pre {{ font-family: {MONO}; font-size: 12px; }}
table {{ border-collapse: collapse; border-spacing: 0; border: none; font-size: 12px; }}
thead {{ border-bottom: 1px solid #bdbdbd; vertical-align: bottom; }}
th, td {{ padding: 3px 8px; vertical-align: middle; }}
tbody tr:nth-child(odd) {{ background: #f5f5f5; }}
tbody tr:hover {{ background: #e1f0fb; }}
details > summary {{ cursor: pointer; }}
"""

# Probability scale: 1.0 is near white (confident, reads as plain text), 0.0 is strong orange.
_HIGH = (255, 255, 255)
_LOW = (240, 120, 40)


def escape(text: str) -> str:
    """HTML-escape text, quotes included (safe inside attributes)."""
    return html.escape(text, quote=True)


class Html(str):
    """Markup built by `el` / `join` (or a constant written here): passed through, never escaped again."""

    __slots__ = ()


def _markup(child: object) -> str:
    if isinstance(child, Html):
        return child
    if child is None:
        return ""
    return escape(str(child))  # text, numbers: always escaped


def join(children: Iterable[object]) -> Html:
    """Children side by side: each `Html` as it is, anything else escaped as text."""
    return Html("".join(_markup(child) for child in children))


def el(tag: str, *children: object, **attributes: object) -> Html:
    """The element `<tag attributes>children</tag>`; text children and every attribute value escaped.

    Attribute names use `_` for `-` (`data_step=3` is `data-step='3'`); None leaves one out.

    >>> el("span", "<b> & 'x'", title="a'b", style="color:red")
    "<span title='a&#x27;b' style='color:red'>&lt;b&gt; &amp; &#x27;x&#x27;</span>"
    """
    if not tag.isalnum():
        raise ValueError(f"not an HTML tag name: {tag!r}")
    attrs = "".join(f" {name.rstrip('_').replace('_', '-')}='{escape(str(value))}'"
                    for name, value in attributes.items() if value is not None)
    return Html(f"<{tag}{attrs}>{join(children)}</{tag}>")


# Colour pairs (background, text): a background is never set without its text colour.
TEXT = "#1f2328"  # text on the white card
MUTED = "#57606a"  # secondary text on the white card
# Every display sits on its own light card, whatever the theme; `only light` and `forced-color-adjust` keep a
# browser's forced dark mode (Chromium's auto-dark) and forced colours from repainting it (mid-scale oranges
# turned brown there).
CARD = f"background:#ffffff;color:{TEXT};color-scheme:only light;forced-color-adjust:none"

# The one colour language of the views (docs/views.md, "Colours"):
CHOSEN = "#0969da"  # the chosen token: outlined (or hatched, in plots) in blue
CHOSEN_BACKGROUND = "#ddf4ff"  # a table cell of the chosen token
REMOVED = ("#ffebe9", "#a40e26")  # a removed token: background, struck-through text
BAR = "#6baed6"  # a probability bar of a token not chosen


def prob_colour(prob: float) -> str:
    """The background colour for a token chosen with probability ``prob`` (0 to 1), as ``#rrggbb``.

    >>> prob_colour(1.0), prob_colour(0.0)
    ('#ffffff', '#f07828')
    """
    p = 0.0 if math.isnan(prob) else min(max(float(prob), 0.0), 1.0)  # NaN shows as the strongest colour
    mixed = (round(high * p + low * (1.0 - p)) for high, low in zip(_HIGH, _LOW))
    return "#" + "".join(f"{channel:02x}" for channel in mixed)


def page(fragment: str, title: str) -> str:
    """A complete HTML document around ``fragment``, with hfbridge's stylesheet in its head.

    >>> page("<b>hi</b>", "x").startswith("<!DOCTYPE html>")
    True
    """
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{escape(title)}</title>\n<style>{_PAGE_CSS}</style>\n</head>\n<body>\n{fragment}\n</body>\n</html>\n"
    )
