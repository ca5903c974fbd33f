"""A griffe extension for the API reference: a docstring's `>>>` examples become `pycon` code blocks.

It also writes the option registry's list where a docstring says `[registry options]`, as the
package does at import for `help()` (`hfbridge/_step/plan/option_docs.py`), since griffe reads the source.

hfbridge's docstrings open with runnable examples (`tests/test_docstrings.py` runs them) written as
plain doctest lines; Markdown would read them as a paragraph (and `[...]` output as links).
mkdocs.yml loads this file through mkdocstrings' `extensions` option.
"""

from __future__ import annotations

from typing import Any

import griffe

from hfbridge._step.plan.option_docs import fill_options


class DoctestsAsCode(griffe.Extension):
    """Fence each run of doctest lines (from `>>>` to the next blank line) as a `pycon` block."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(fill_options(obj.docstring.value) or "")


def fence_doctests(text: str) -> str:
    """`text` with every doctest run fenced.

    >>> print(fence_doctests("Adds.\\n\\n>>> 1 + 1\\n2"))
    Adds.
    <BLANKLINE>
    ```pycon
    >>> 1 + 1
    2
    ```
    """
    out: list[str] = []
    indent = None  # the open block's indentation, None outside a block
    for line in text.splitlines():
        if indent is None and line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
        elif indent is not None and not line.strip():
            out.append(f"{indent}```")
            indent = None
        out.append(line)
    if indent is not None:
        out.append(f"{indent}```")
    return "\n".join(out)
