"""DRY's sequence breakers: strings or token-id sequences, compiled into heads and tails of token ids.

llama.cpp's rules (`get_overlapping_token_sequences`, after koboldcpp), on bytes: a breaker string is at
most 40 characters; every token whose bytes *contain* the string's UTF-8 is a single-token breaker; a
token whose bytes *end with a prefix* of it (starting at an occurrence of its first byte) is the head
of a multi-token breaker whose tail is the tokenization of the rest (at most 20 tokens). A token's
bytes are its own (`_token_bytes.py`), so "é" held by two byte tokens is found. A token-id sequence is
a head (its first id) and a tail (the rest).

The compiled form, `Breakers`, holds the single-token breaker ids and, for each distinct tail, the
set of heads that start it; `Breakers.masks(vocab, device)` lends them as boolean masks over the
vocabulary, made once per vocabulary width and device.

>>> breakers = compile_breakers([[5], [7, 8, 9]], tokenizer=None)
>>> sorted(breakers.singles), breakers.tails
([5], {(8, 9): {7}})
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from hfbridge.processors._rows import described
from hfbridge.processors._token_bytes import vocabulary_bytes

__all__ = ["Breakers", "compile_breakers"]

MAX_CHARS = 40  # llama.cpp's MAX_CHAR_LEN
MAX_TAIL = 20  # llama.cpp's MAX_SEQ_LEN


class Breakers:
    """Single-token breakers and multi-token ones (`tails`: tail -> heads)."""

    def __init__(self, singles: set[int], tails: dict[tuple[int, ...], set[int]]):
        self.singles = singles
        self.tails = tails
        self._masks: dict[tuple[int, torch.device], tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = {}

    def __len__(self) -> int:
        return len(self.singles) + sum(len(heads) for heads in self.tails.values())

    def masks(self, vocab: int, device: torch.device) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """`(single, groups)`: `single` a `(vocab,)` bool mask of the single-token breakers, `groups`
        a list of `(heads (vocab,) bool, tail (L,) int64)` for the multi-token ones."""
        key = (vocab, device)
        cached = self._masks.get(key)
        if cached is None:
            width = max([vocab, *(i + 1 for i in self.singles),
                         *(i + 1 for heads in self.tails.values() for i in heads)])
            single = torch.zeros(width, dtype=torch.bool)
            if self.singles:
                single[list(self.singles)] = True
            groups = []
            for tail, heads in sorted(self.tails.items()):
                mask = torch.zeros(width, dtype=torch.bool)
                mask[sorted(heads)] = True
                groups.append((mask.to(device), torch.tensor(tail, dtype=torch.long, device=device)))
            cached = (single.to(device), groups)
            self._masks[key] = cached
        return cached


def compile_breakers(sequence_breakers: Iterable[Any], tokenizer: Any) -> Breakers:
    """`Breakers` from strings (need `tokenizer`) and token-id sequences; errors name the argument."""
    if isinstance(sequence_breakers, (str, bytes)) or not isinstance(sequence_breakers, Iterable):
        raise TypeError("`sequence_breakers` must be a list of strings or of token-id sequences, got "
                        f"{described(sequence_breakers)}.")
    singles: set[int] = set()
    tails: dict[tuple[int, ...], set[int]] = {}
    strings: list[str] = []
    for index, breaker in enumerate(sequence_breakers):
        if isinstance(breaker, str):
            if not breaker:
                raise ValueError(f"`sequence_breakers[{index}]` is an empty string.")
            strings.append(breaker[:MAX_CHARS])
            continue
        if isinstance(breaker, torch.Tensor):
            breaker = breaker.tolist()
        if not isinstance(breaker, (list, tuple)) or not breaker or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in breaker
        ):
            raise TypeError(f"`sequence_breakers[{index}]` must be a string or a non-empty sequence of token ids "
                            f"(ints >= 0), got {described(breaker)}.")
        _add(singles, tails, breaker[0], tuple(breaker[1:]))
    if strings:
        if tokenizer is None:
            raise ValueError(
                f"DRY's sequence breakers {strings!r} are strings: pass `tokenizer=` (the tokenizer that made "
                "input_ids) to find them in the vocabulary, or give each breaker as a list of token ids "
                "(`dry_sequence_breakers=[]` for none)."
            )
        for head, tail in _string_breakers(tokenizer, tuple(strings)):
            _add(singles, tails, head, tail)
    return Breakers(singles, tails)


def _add(singles: set[int], tails: dict[tuple[int, ...], set[int]], head: int, tail: tuple[int, ...]) -> None:
    if tail:
        tails.setdefault(tail, set()).add(int(head))
    else:
        singles.add(int(head))


# Decoding every token of a 128k vocabulary takes about a second: the pairs are kept per tokenizer.
_CACHE: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], list[tuple[int, tuple[int, ...]]]]] = \
    weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _string_breakers(tokenizer: Any, strings: tuple[str, ...]) -> list[tuple[int, tuple[int, ...]]]:
    try:
        with _LOCK:
            known = _CACHE.get(tokenizer, {}).get(strings)
    except TypeError:  # a tokenizer that cannot be weakly referenced: no cache
        known = None
    if known is not None:
        return known
    try:
        size = len(tokenizer)
        texts = tokenizer.batch_decode([[token] for token in range(size)])
        words = vocabulary_bytes(tokenizer, texts)  # each token's own bytes (part of a character included)
    except Exception as error:  # anything a tokenizer-like object raises
        raise TypeError(f"`tokenizer` must be a transformers tokenizer (len() and batch_decode), got "
                        f"{type(tokenizer).__name__}: {error}") from None
    pairs: list[tuple[int, tuple[int, ...]]] = []
    by_bytes: dict[bytes, int] | None = None
    for string in strings:
        text = string.encode("utf-8")  # matched on bytes, as llama.cpp does: "é" may span two byte tokens
        seen: set[tuple[int, tuple[int, ...]]] = set()
        for token, word in enumerate(words):
            if not word:
                continue
            if text in word:
                pair: tuple[int, tuple[int, ...]] = (token, ())
                if pair not in seen:
                    seen.add(pair)
                    pairs.append(pair)
                continue
            position = word.find(text[:1])
            while position != -1:
                rest = word[position:]  # the word ends with a prefix of `text`
                if text.startswith(rest):
                    if by_bytes is None:
                        by_bytes = {}
                        for other, piece in enumerate(words):
                            by_bytes.setdefault(piece, other)
                    tail = _tokenized(tokenizer, text[len(rest):], by_bytes)[:MAX_TAIL]
                    if (token, tail) not in seen:
                        seen.add((token, tail))
                        pairs.append((token, tail))
                position = word.find(text[:1], position + 1)
    try:
        with _LOCK:
            _CACHE.setdefault(tokenizer, {})[strings] = pairs
    except TypeError:
        pass
    return pairs


def _tokenized(tokenizer: Any, rest: bytes, by_bytes: dict[bytes, int]) -> tuple[int, ...]:
    """The tokens of the bytes `rest`: the tokenizer's own encoding when they are whole characters,
    else the longest tokens whose bytes match, left to right (a byte-level vocabulary holds every byte)."""
    try:
        return tuple(tokenizer.encode(rest.decode("utf-8"), add_special_tokens=False))
    except UnicodeDecodeError:
        pass
    tokens: list[int] = []
    start = 0
    while start < len(rest):
        end = next((end for end in range(len(rest), start, -1) if rest[start:end] in by_bytes), None)
        if end is None:
            return ()  # bytes no token holds: no tail can match them
        tokens.append(by_bytes[rest[start:end]])
        start = end
    return tuple(tokens)
