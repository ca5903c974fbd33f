"""A token's text and its own bytes, for the views and `logprobs` (the bytes: `processors/_token_bytes.py`).

>>> token_text(None, 7)
('7', b'7')
"""

from __future__ import annotations

from typing import Any

from hfbridge.processors._token_bytes import token_bytes

__all__ = ["token_text"]


def token_text(tokenizer: Any, token: int) -> tuple[str, bytes]:
    """`(text, bytes)` of one token: its `decode([token])` (the id without a tokenizer) and its own bytes,
    which rebuild the text when concatenated with its neighbours' even where a token holds part of a
    character (OpenAI's `bytes`)."""
    if tokenizer is None:
        return str(token), str(token).encode("utf-8")
    text = tokenizer.decode([token])
    return text, token_bytes(tokenizer, token, text)
