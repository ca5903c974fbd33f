"""A row's generated text for banned strings: a short window decoded per token, or all of it (`FullText`).

Banned strings look at the text of a row's generated tokens after every token. Decoding all of it at every
step costs time in proportion to its length (quadratic in the generation). `WindowText` decodes a window of
a few tokens at the end and keeps the text before it. Decoding is not concatenation: `decode(a + b)` can differ
from `decode(a) + decode(b)` (a SentencePiece-like decoder drops the leading space of the first token, the bytes
of one character can lie in several tokens, byte-fallback tokens decode as one run, `clean_up_tokenization_spaces`
removes a space before punctuation), so the window starts some tokens early and only its text after them is
used, as incremental detokenizers do (transformers' `TextStreamer`, TGI's prefix and read offsets), with a check
that makes a changed earlier text fall back to a longer window:

1. A *seam* is a token count `s` with its text `decode(ids[:s])` known (the whole text at an earlier step,
   which ended on a whole character) and the text of the tokens just before it, `prefix = decode(ids[a:s])`
   (the *anchor* `a` at least 8 tokens and 16 characters before `s`, or the start). The start is a seam.
2. At each step the window `decode(ids[a:])` is decoded. When it begins with `prefix`, the text is
   `decode(ids[:s]) + window[len(prefix):]`: the tokens in the prefix give the decoder the context the tokens
   after `s` have in the whole sequence, and what context changes at the window's start stays in the prefix.
3. When the window does not begin with `prefix`, the new token changed text before the seam (a run of
   byte-fallback tokens that no longer decodes, a space removed before punctuation): that seam is dropped and
   the step is decoded again from the one before it (the start, at worst: the whole text).
4. When the window holds 16 tokens after the seam and its text ends on a whole character, the end becomes a
   new seam (one more decode, of the new prefix).
5. A rollback drops the seams after the new end.

This is exact for a decoder whose effects reach back fewer than 8 tokens and 16 characters, or reach into the
prefix (the check sees them): the decoders of `tokenizers` (byte-level, Metaspace, byte fallback, WordPiece,
word-level, CTC) and transformers' clean-up of spaces; `tests/generate/test_banned_decode.py` checks them
against the whole decode at every step. `FullText` decodes the whole text (for a `decode` that is not a
transformers or `tokenizers` tokenizer's).

>>> from tokenizers import Tokenizer, decoders, models
>>> raw = Tokenizer(models.BPE({"▁a": 0, "b": 1, "▁": 2}, merges=[]))
>>> raw.decoder = decoders.Metaspace()                          # drops the first token's leading space
>>> text = WindowText(raw.decode)
>>> ids = [0, 1, 2] * 12
>>> for count in range(1, len(ids) + 1):
...     text.update(ids, count)
...     assert text.full() == raw.decode(ids[:count])
>>> text.full()[:8], text.view(text.length - 4), text.length
('ab  ab  ', ' ab ', 47)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

from hfbridge._hf.tokenizer_decode import backend_decode

__all__ = ["FullText", "WindowText", "row_text"]

_REPLACEMENT = "\ufffd"  # what a decoder shows for the bytes of a character that is not complete yet
MARGIN_TOKENS = 8  # the window's anchor lies at least this many tokens before its seam ...
MARGIN_CHARS = 16  # ... and this many characters of text
SPAN = 16  # tokens after the seam before the end becomes the next seam


class _Seam(NamedTuple):
    tokens: int  # s: tokens before the seam
    chars: int  # len(decode(ids[:s]))
    anchor: int  # a: where the window starts
    prefix: str  # decode(ids[a:s])


class FullText:
    """The whole text decoded at every update: the reference, and the route for a `decode` of another kind."""

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._text = ""

    def update(self, ids: Sequence[int], count: int) -> None:
        """Take the text of `ids[:count]`."""
        self._text = self._decode(ids[:count]) if count else ""

    @property
    def length(self) -> int:
        return len(self._text)

    def stable_end(self) -> int:
        """The length without a trailing run of U+FFFD (a character still incomplete)."""
        return len(self._text.rstrip(_REPLACEMENT))

    def full(self) -> str:
        return self._text

    def view(self, start: int) -> str:
        """The text from character `start` on."""
        return self._text[start:]


class WindowText:
    """The text of a row's tokens, decoded a window at a time (see the module).

    Args:
        decode: `decode(ids) -> str`, the tokenizer's.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._seams = [_Seam(0, 0, 0, "")]
        self._chunks: list[str] = []  # chunk k: the text between seams k and k + 1
        self._tail = ""  # the text after the last seam
        self._full: str | None = ""

    def update(self, ids: Sequence[int], count: int) -> None:
        """Take the text of `ids[:count]`; `ids` are the last update's ids, cut and / or extended."""
        seams = self._seams
        while seams[-1].tokens > count:  # a rollback before the seam
            seams.pop()
            self._chunks.pop()
        self._full = None
        while True:
            seam = seams[-1]
            if seam.tokens == count:
                self._tail = ""
                return
            window = self._decode(ids[seam.anchor:count])
            if window.startswith(seam.prefix):
                break
            seams.pop()  # the text before the seam changed: decode from the one before (the start always holds)
            self._chunks.pop()
        self._tail = window[len(seam.prefix):]
        if count - seam.tokens >= SPAN and self._tail and not self._tail.endswith(_REPLACEMENT):
            self._add_seam(ids, count)

    def _add_seam(self, ids: Sequence[int], count: int) -> None:
        anchor = max(0, count - MARGIN_TOKENS)
        while True:
            prefix = self._decode(ids[anchor:count])
            if anchor == 0 or (len(prefix) >= MARGIN_CHARS and not prefix.endswith(_REPLACEMENT)):
                break
            anchor = max(0, 2 * anchor - count)  # twice as many tokens
        self._seams.append(_Seam(count, self.length, anchor, prefix))
        self._chunks.append(self._tail)
        self._tail = ""

    @property
    def length(self) -> int:
        return self._seams[-1].chars + len(self._tail)

    def stable_end(self) -> int:
        """The length without a trailing run of U+FFFD (the text before the last seam ends on a whole character)."""
        return self._seams[-1].chars + len(self._tail.rstrip(_REPLACEMENT))

    def full(self) -> str:
        if self._full is None:
            self._full = "".join(self._chunks) + self._tail
        return self._full

    def view(self, start: int) -> str:
        """The text from character `start` on (the chunks it needs, not the whole text)."""
        at = self._seams[-1].chars
        if start >= at:
            return self._tail[start - at:]
        if start == 0 or self._full is not None:
            return self.full()[start:]
        parts, index = [self._tail], len(self._chunks)
        while at > start:
            index -= 1
            parts.append(self._chunks[index])
            at -= len(self._chunks[index])
        return "".join(reversed(parts))[start - at:]


def row_text(tokenizer: Any) -> Callable[[], FullText | WindowText]:
    """What keeps a row's text for `tokenizer`: a window for transformers' and `tokenizers`' tokenizers (whose
    decoders the tests check), the whole decode for any other object with a `decode(ids)`. A fast tokenizer that
    adds nothing to its `tokenizers` decode is decoded by that directly (`_hf/tokenizer_decode.py`)."""
    import tokenizers
    from transformers import PreTrainedTokenizerBase

    if not isinstance(tokenizer, (PreTrainedTokenizerBase, tokenizers.Tokenizer)):
        return lambda: FullText(tokenizer.decode)
    decode = cast(Callable[[Sequence[int]], str], tokenizer.decode)  # one sequence in, one text out
    return lambda: WindowText(backend_decode(tokenizer) or decode)
