"""How a step's errors name `generate`'s step: the processors' stage and the choice's, told apart.

A processor's own exception keeps its type and message and gets a note naming the step; a processor
that returns something unusable (`BadProcessorOutput`) and the choice's checks (nothing left to choose,
a generator on another device) become `generate(): at step N: ...`. Outside `generate` (`at` is None)
both stages raise as they are.

>>> at_step(3, lambda: int("x"))
Traceback (most recent call last):
ValueError: generate(): at step 3: invalid literal for int() with base 10: 'x'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hfbridge._step.run.processor_list import BadProcessorOutput

__all__ = ["add_note", "at_step", "processors_stage"]

T = TypeVar("T")


def at_step(at: int | None, action: Callable[[], T]) -> T:
    """Run `action`; in `generate` (`at`: its step) a `ValueError`/`TypeError` of hfbridge's checks gets the
    step number in front."""
    if at is None:
        return action()
    try:
        return action()
    except (ValueError, TypeError) as error:
        kind = ValueError if isinstance(error, ValueError) else TypeError
        raise kind(f"generate(): at step {at}: {error}") from None


def processors_stage(at: int | None, stage: Callable[[], T]) -> T:
    """Run the processors' stage; in `generate` (`at`: its step) their errors name the step."""
    if at is None:
        return stage()
    try:
        return stage()
    except BadProcessorOutput as error:
        kind = TypeError if isinstance(error, TypeError) else ValueError
        raise kind(f"generate(): at step {at}: {error}") from None
    except Exception as error:
        add_note(error, f"hfbridge.generate: raised by the logits processors at step {at}.")
        raise


def add_note(error: BaseException, note: str) -> None:
    """`error.add_note(note)`, also on Python 3.10 (the note kept where 3.11 would put it)."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:
        notes: Any = [*getattr(error, "__notes__", []), note]
        error.__notes__ = notes  # type: ignore[attr-defined]
