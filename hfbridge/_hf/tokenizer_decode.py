"""`backend_decode`: the `tokenizers` decode that a fast tokenizer's `decode(ids)` runs, without transformers' layers.

`PreTrainedTokenizerFast.decode(ids)` (4.46 to 5.x) converts `ids` to a list (`to_py_obj`, a Python check of
each id) and calls `_decode`, which calls the `tokenizers` tokenizer's `decode(ids, skip_special_tokens=False)`
and, with `clean_up_tokenization_spaces` set, cleans up spaces. For a few ids (banned strings decode a window of
some 30 tokens per step) those layers cost more than the decoding. When the tokenizer's class keeps
transformers' own `decode` and `_decode` and cleans up nothing, `backend_decode` returns the `tokenizers`
decode, which gives the same text; otherwise None (the caller keeps `tokenizer.decode`).

>>> from tokenizers import Tokenizer, decoders, models
>>> from transformers import PreTrainedTokenizerFast
>>> raw = Tokenizer(models.BPE({"a": 0, "b": 1}, merges=[]))
>>> raw.decoder = decoders.Fuse()
>>> tok = PreTrainedTokenizerFast(tokenizer_object=raw)
>>> decode = backend_decode(tok)
>>> decode([0, 1, 0]) == tok.decode([0, 1, 0]) == "aba"
True
>>> tok.clean_up_tokenization_spaces = True
>>> backend_decode(tok) is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = ["backend_decode"]


def backend_decode(tokenizer: Any) -> Callable[[Sequence[int]], str] | None:
    """`tokenizer.backend_tokenizer`'s decode when it gives `tokenizer.decode(ids)`'s text; else None."""
    kind = type(tokenizer)
    if not isinstance(tokenizer, PreTrainedTokenizerFast) or tokenizer.clean_up_tokenization_spaces:
        return None
    if kind.decode is not PreTrainedTokenizerBase.decode or kind._decode is not PreTrainedTokenizerFast._decode:
        return None  # a class of its own (timestamps, offsets, ...): its decode may do more
    backend = tokenizer.backend_tokenizer

    def decode(ids: Sequence[int]) -> str:
        return backend.decode(ids, skip_special_tokens=False)
    return decode
