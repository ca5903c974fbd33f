"""Banned strings and patterns on a row's decoded text: where a match begins, and what must be held back.

Two kinds of bans, as exllamav2 and koboldcpp have them, on the text of the generated tokens:

- a banned string matches as a substring, case-insensitively (exllamav2 lowercases both sides;
  here `regex`'s `IGNORECASE`, which keeps character offsets), with no word boundaries: `"shiver"`
  also bans `"shivers"` and `"Shivering"`;
- a banned pattern is a regular expression (the `regex` module, a dependency of transformers, which
  also answers "could this text still become a match?"), case-sensitive unless it says `(?i)`; a
  whole word is `r"\\bdelve\\b"`.

`check_text` looks at a text once per step. A match is decided when more text cannot change it:
a banned string as soon as it is complete; a pattern once the match ends before the end of the text
(`\\b`, `$`, a lookahead or a greedy repeat at the end may still change with the next character), or
when the row's text is final (its last token ended it, or the length limit). Zero-width matches are
ignored (they cover no text to take back). `hold` is the first character at which a match could still
begin: text before it is final, text from it on may still be taken back.

>>> bans = compile_bans(["shivers down"], [r"\\bdelve\\b"])
>>> check_text(bans, "Cold shivers do", 0)                # a banned string could still complete
Verdict(match=None, pattern=None, hold=5)
>>> check_text(bans, "Cold SHIVERS DOWN", 0).match        # complete: decided at once
5
>>> check_text(bans, "we delve", 0)                       # `delves` would not match: undecided
Verdict(match=None, pattern=None, hold=3)
>>> check_text(bans, "we delve.", 0).match, check_text(bans, "we delve", 0, final=True).match
(3, 3)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import regex  # type: ignore[import-untyped]  # transformers' dependency; no stubs installed

__all__ = ["Ban", "Verdict", "check_text", "compile_bans", "stable_length", "strings_screen"]

_REPLACEMENT = "\ufffd"  # what a decoder shows for the bytes of a character that is not complete yet
# What lets a pattern read more than one character before its match: a lookbehind (or, counted with them, a
# named group `(?<name>`), reverse searching (flag r), Unicode's word rules (flag w), grapheme clusters (\X).
# Any other construct reads the match's characters and at most the one before it (\b, \B, \m, \M, ^ and \A,
# which hold at a search's start only when it is the text's start too).
_UNBOUNDED = regex.compile(r"\(\?<|\(\?[a-zA-Z0-9-]*[rw]|\\X")


@dataclasses.dataclass(frozen=True)
class Ban:
    """One banned string (`literal`) or pattern, as the caller gave it and compiled."""

    source: str
    compiled: Any  # regex.Pattern
    literal: bool
    context: int | None = None  # characters before a match's start that it may read (None: any)

    @property
    def kind(self) -> str:
        return "string" if self.literal else "pattern"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What one look at a text found.

    Attributes:
        match: The character where the leftmost decided match begins, or None.
        pattern: The `Ban` that matched there (None without a match).
        hold: The first character where a match could still begin (the text's length when none can).
    """

    match: int | None
    pattern: Ban | None
    hold: int


def compile_bans(strings: Any, patterns: Any) -> tuple[Ban, ...]:
    """Check and compile `banned_strings` and `banned_regex` (each None, or a list / tuple of str)."""
    bans = [Ban(text, regex.compile(regex.escape(text), regex.IGNORECASE), True, 0)
            for text in _strings("banned_strings", strings)]
    for index, source in enumerate(_strings("banned_regex", patterns)):
        try:
            compiled = regex.compile(source)
        except regex.error as error:
            raise ValueError(f"`banned_regex[{index}]` = {source!r} is not a valid regular expression: {error}.") \
                from None
        if compiled.fullmatch("") is not None:
            raise ValueError(f"`banned_regex[{index}]` = {source!r} matches the empty string, so it would ban "
                             "every position; make it match at least one character.")
        bans.append(Ban(source, compiled, False, None if _UNBOUNDED.search(source) else 1))
    return tuple(bans)


def _strings(name: str, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TypeError(f"`{name}` must be a list of strings, got {type(value).__name__} {value!r}"
                        f"{' (wrap one string in a list)' if isinstance(value, str) else ''}.")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise TypeError(f"`{name}[{index}]` must be a string, got {type(item).__name__} {item!r}.")
        if not item:
            raise ValueError(f"`{name}[{index}]` is an empty string.")
    return list(value)


def stable_length(text: str, final: bool) -> int:
    """The length of `text` without a trailing run of U+FFFD (a character still incomplete), unless final."""
    return len(text) if final else len(text.rstrip(_REPLACEMENT))


def check_text(bans: Iterable[Ban], text: str, pos: int, *, final: bool = False) -> Verdict:
    """The leftmost decided match of any ban in `text` at or after character `pos`, and where to hold.

    Args:
        bans: From `compile_bans`.
        text: The row's generated text so far.
        pos: Where to start looking (text before it was final at an earlier look); lookbehinds and
            `\\b` still see the text before it.
        final: The text is complete: a match that reaches its end is decided.
    """
    end = stable_length(text, final)
    hold, match, found = end, None, None
    for ban in bans:
        for candidate in ban.compiled.finditer(text, pos, end, partial=not final, overlapped=True):
            start, stop = candidate.span()
            if match is not None and start >= match:
                break  # a match further left is already decided
            if stop == start:
                continue  # zero width: nothing to take back
            decided = not candidate.partial and (final or ban.literal or stop < end)
            if decided:
                match, found = start, ban
                break
            hold = min(hold, start)
    if match is not None:
        hold = min(hold, match)
    return Verdict(match, found, hold)


def strings_screen(bans: tuple[Ban, ...]) -> Any | None:
    """When every ban is a banned string: one pattern for them all (None otherwise).

    Where `screen.search(text, pos, end, partial=not final)` finds nothing (`end`: `check_text`'s), no banned
    string matches from `pos`, not even in part at the end: `check_text` would return `Verdict(None, None, end)`.
    One search instead of one per banned string, at the steps where nothing is near a match.
    """
    if not all(ban.literal for ban in bans):
        return None
    return regex.compile("|".join(f"(?:{ban.compiled.pattern})" for ban in bans), regex.IGNORECASE)
