"""The checks every option check is made of: a flag, a number, an int, and how a rejected value is shown.

`option_checks` (HF's options) and `watermark` (the watermark configs) build their messages from
these, so that one kind of wrong value reads the same wherever it is refused.

>>> check_number("top_p", float("nan"), positive=False)
Traceback (most recent call last):
...
ValueError: `top_p` must be a finite number, got nan.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from hfbridge.processors._rows import described

__all__ = ["check_flag", "check_number", "got", "is_int"]


def check_flag(name: str, value: Any, *, optional: bool = True) -> None:
    """`TypeError` unless `value` is a bool (or None when `optional`).

    >>> check_flag("fast", "no")
    Traceback (most recent call last):
    ...
    TypeError: `fast` must be a bool (True or False), got str 'no'.
    """
    if (value is None and optional) or isinstance(value, bool):
        return
    raise TypeError(f"`{name}` must be a bool (True or False), got {got(value)}.")


def is_int(value: Any) -> bool:
    """An int, not a bool (which Python counts as one)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def got(value: Any) -> str:
    """`type repr` of a rejected value for an error message, the repr cut at 40 characters (the one
    description of a value every check uses, `hfbridge.processors`' own included: `described`)."""
    return described(value)


def check_number(name: str, value: Any, *, positive: bool) -> None:
    """`TypeError` unless `value` is a real number (not a bool); `ValueError` unless finite (> 0 if `positive`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a number, got {got(value)}.")
    if not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    if positive and value <= 0:
        raise ValueError(f"`{name}` must be a number > 0, got {value!r}.")
