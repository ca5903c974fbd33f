"""The registry's own checks for options whose values the bounds cannot say (`OptionRow.check`: mirostat's
mode, a thinking budget's tags and message, DRY's sequence breakers, the temperature; `HFOptionRow.check`:
counts and the options of beam search and assisted decoding).

>>> check_tag("thinking_start", [5, 6])
>>> check_tag("thinking_start", [])
Traceback (most recent call last):
...
ValueError: `thinking_start` is empty: give at least one token id.
"""

from __future__ import annotations

import numbers
from typing import Any

from hfbridge._step.checks.value_checks import check_number, got, is_int
from hfbridge.processors._dry_breakers import compile_breakers
from hfbridge.processors._rows import RowParam, described, plain

__all__ = ["check_breakers", "check_count", "check_early_stopping", "check_message", "check_mirostat", "check_real",
           "check_schedule", "check_tag", "check_temperature"]


def check_mirostat(name: str, value: Any) -> None:
    value = plain(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int (0 = off, 1 = mirostat 1.0, 2 = mirostat 2.0), "
                        f"got {described(value)}.")
    if value not in (0, 1, 2):
        raise ValueError(f"`{name}` must be 0 (off), 1 (mirostat 1.0) or 2 (mirostat 2.0), got {value!r}.")


def check_tag(name: str, value: Any, *, empty: bool = False) -> None:
    # a string (tokenized with the tokenizer when the processor is built) or token ids
    if isinstance(value, str):
        if not value and not empty:
            raise ValueError(f"`{name}` is an empty string.")
        return
    if hasattr(value, "tolist") and getattr(value, "ndim", None) == 1 and str(value.dtype).split(".")[-1].startswith(
            ("int", "uint")):
        value = value.tolist()  # a tensor or numpy array of ids
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(token, numbers.Integral) and not isinstance(token, bool) and int(token) >= 0 for token in value):
        raise TypeError(f"`{name}` must be a string or a sequence of token ids (ints >= 0), got {described(value)}.")
    if not value and not empty:
        raise ValueError(f"`{name}` is empty: give at least one token id.")


def check_message(name: str, value: Any) -> None:
    check_tag(name, value, empty=True)


def check_breakers(name: str, value: Any) -> None:
    # token-id sequences are compiled here; strings only checked (the tokenizer comes with the processor)
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"`{name}` must be a list of strings or of token-id sequences, got {described(value)}.")
    for index, breaker in enumerate(value):
        if isinstance(breaker, str):
            if not breaker:
                raise ValueError(f"`{name}[{index}]` is an empty string.")
            continue
        try:
            compile_breakers([breaker], tokenizer=None)
        except (TypeError, ValueError):
            raise TypeError(f"`{name}[{index}]` must be a string or a non-empty sequence of token ids (ints >= 0), "
                            f"got {described(breaker)}.") from None


def check_temperature(name: str, value: Any) -> None:
    RowParam(name, value, check=lambda v: "must be >= 0 (0 is greedy)" if v < 0 else None)


def check_count(name: str, value: Any, minimum: int | None) -> None:
    """`TypeError` unless `value` is an int (not a bool), `ValueError` when it is below `minimum`."""
    if not is_int(value):
        raise TypeError(f"`{name}` must be an int{'' if minimum is None else f' >= {minimum}'}, got {got(value)}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}.")


# the options of beam search and assisted / prompt-lookup decoding
# HF's loops read these without checking them: `length_penalty="2"` failed after the first model call,
# `nan` gave meaningless beams, `num_assistant_tokens=inf` an OverflowError inside the draft loop.

_SCHEDULES = ("constant", "heuristic", "heuristic_transient")


def check_real(name: str, value: Any, low: float | None = None, high: float | None = None) -> None:
    """A finite real (not a bool) in `[low, high]`."""
    check_number(name, value, positive=False)
    if (low is not None and value < low) or (high is not None and value > high):
        expected = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"`{name}` must be a number {expected}, got {value!r}.")


def check_early_stopping(name: str, value: Any) -> None:
    if not (isinstance(value, bool) or (value == "never" and isinstance(value, str))):
        raise TypeError(f"`{name}` must be True, False or \"never\", got {got(value)}.")


def check_schedule(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"`{name}` must be one of {list(_SCHEDULES)}, got {got(value)}.")
    if value not in _SCHEDULES:
        raise ValueError(f"`{name}` must be one of {list(_SCHEDULES)}, got {value!r}.")
