"""The option lists of the public docstrings, written from the option registry (`option_table.ROWS`).

`sample_step`, `Sampler`, `generate` and `explain_step` hold a line `[registry options]` in their
docstrings; `fill_options` replaces it with one line per processor naming its options, so `help()`,
Jupyter's `?` and the API reference (the griffe extension in `docs/_griffe/` calls it too) list every
option of the registry, the newest included, without a hand-kept copy.

>>> print(fill_options("Args:\\n    x: Options.\\n        [registry options]").splitlines()[6])
        - `TopKLogitsWarper` (HF): `top_k`* (off 0).
"""

from __future__ import annotations

import textwrap

from hfbridge._step.plan.option_table import ROWS, OptionRow

__all__ = ["MARKER", "fill_options", "option_lines"]

MARKER = "[registry options]"

_HEAD = ("Every option of the registry, by the processor it builds (`*`: one value per row allowed; "
         "\"off\": the value that builds nothing; a default: the value used when not set, llama.cpp's):")


def _value(value: object) -> str:
    if isinstance(value, (tuple, list)) and len(value) > 4:
        return f"{len(value)} strings"
    return repr(value)


def _option(row: OptionRow) -> str:
    if row.is_off is not None:
        note = f" (off below 0, default {_value(row.default)})"
    elif row.off is not None:
        note = f" (off {_value(row.off)})"
    elif row.community and row.default is not None:
        note = f" (default {_value(row.default)})"
    else:
        note = ""
    return f"`{row.name}`" + ("*" if row.per_row else "") + note


def option_lines() -> list[str]:
    """The list: per processor (in the registry's order), its class and its options, wrapped at 100 columns."""
    groups: dict[str, list[OptionRow]] = {}
    for row in ROWS.values():
        if row.processor is None:
            kind = "the chain's order"
        else:
            name = row.processor if isinstance(row.processor, str) else row.processor.__name__
            kind = f"`{name}`" + (" (HF)" if not row.community else "")
        groups.setdefault(kind, []).append(row)
    return [line for kind, rows in groups.items()
            for line in textwrap.wrap(f"- {kind}: " + ", ".join(_option(row) for row in rows) + ".", width=100,
                                      subsequent_indent="  ", break_on_hyphens=False)]


def fill_options(doc: str | None) -> str | None:
    """`doc` with its `[registry options]` line replaced by the option list, at that line's indentation."""
    if doc is None or MARKER not in doc:
        return doc
    out = []
    for line in doc.splitlines():
        if line.strip() != MARKER:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.extend(indent + line for line in textwrap.wrap(_HEAD, width=100, break_on_hyphens=False))
        out.append("")  # Markdown starts a list after a blank line only
        out.extend(indent + entry for entry in option_lines())
    return "\n".join(out) + ("\n" if doc.endswith("\n") else "")
