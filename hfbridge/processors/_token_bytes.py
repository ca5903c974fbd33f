"""A token's own bytes: what it adds to the text, even when that is part of one UTF-8 character.

A tokenizer's `decode([id])` of a token that holds part of a character ("é" is bytes C3 A9; a
byte-level vocabulary may hold them as two tokens) gives the replacement character U+FFFD, whose
bytes are not the token's. The token's own bytes come from its piece instead: a byte-level piece
(GPT-2's alphabet, every byte shown as one printable character) maps back through that alphabet; a
byte-fallback piece (`<0xC3>`, SentencePiece's) is the byte it names. Consecutive tokens' bytes then
rebuild the text (OpenAI's `bytes` of a log probability), and llama.cpp matches DRY's breakers on
them.

>>> _BYTE_OF["Ġ"], _BYTE_OF["!"]
(32, 33)
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["token_bytes", "vocabulary_bytes"]


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shown = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in shown:
            shown[byte] = chr(256 + extra)  # the bytes that are not printable move above 255, in order
            extra += 1
    return {character: byte for byte, character in shown.items()}


_BYTE_OF = _byte_alphabet()
_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_REPLACEMENT = "\ufffd"


def _from_piece(piece: Any, text: str) -> bytes:
    if isinstance(piece, str) and piece:
        fallback = _FALLBACK.fullmatch(piece)
        if fallback is not None:
            return bytes([int(fallback.group(1), 16)])
        if all(character in _BYTE_OF for character in piece):
            return bytes(_BYTE_OF[character] for character in piece)
    return text.encode("utf-8")


def token_bytes(tokenizer: Any, token: int, text: str | None = None) -> bytes:
    """The bytes token `token` adds to the text (`text`: its `decode([token])`, when already known).

    Tokens that decode to whole characters give their text's UTF-8; a token that decodes to U+FFFD
    gives the bytes of its piece (see the module).
    """
    text = tokenizer.decode([token]) if text is None else text
    if _REPLACEMENT not in text:
        return text.encode("utf-8")
    return _from_piece(tokenizer.convert_ids_to_tokens(token), text)


def vocabulary_bytes(tokenizer: Any, texts: list[str]) -> list[bytes]:
    """`token_bytes` of every token, given every token's `decode` (`texts`, in id order)."""
    broken = [token for token, text in enumerate(texts) if _REPLACEMENT in text]
    pieces = tokenizer.convert_ids_to_tokens(broken) if broken else []
    result = [text.encode("utf-8") for text in texts]
    for token, piece in zip(broken, pieces):
        result[token] = _from_piece(piece, texts[token])
    return result
