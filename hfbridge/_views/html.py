"""Shared HTML pieces for hfbridge's displays: fonts, the probability colour scale, standalone pages.

A display has two forms. In a notebook, `_repr_html_` returns a fragment whose root element
carries its font inline, because notebook front ends keep only inline styles reliably (GitHub's
viewer drops `<style>` blocks). Outside a notebook, `page` wraps the same fragment in a complete
document with its own stylesheet, so a saved file looks like the notebook and not like a bare
browser default (serif text, tables without padding).
"""

from __future__ import annotations

import html
import math

__all__ = ["FONT", "FONT_STYLE", "MONO", "ROOT_STYLE", "escape", "page", "prob_colour"]

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
