"""The real vocabulary when `vocab_size=` is not passed: what a tokenizer can produce.

A model's output is often wider than its tokenizer (nanoGPT pads GPT-2's 50257 tokens to 50304
columns). The padding columns are no tokens: drawn, they decode to `''`, or the model cannot embed
them at the next step. When the caller passes a tokenizer and no `vocab_size`, a step drops the
columns from the tokenizer's size on, as `vocab_size=` would; `vocab_size=` (the logits' width to
keep every column) always wins. An HF model passed to `generate` keeps every column of its logits
(`config.vocab_size`), as its own `model.generate` does.

>>> from tokenizers import Tokenizer, models
>>> tokenizer_size(Tokenizer(models.WordLevel({"a": 0, "b": 1, "<unk>": 2}, unk_token="<unk>")))
3
>>> tokenizer_size(None) is None
True
>>> check_drawn_ids([1, 5], columns=8, tokenizer=["a", "b", "c"], caller="logprobs")
Traceback (most recent call last):
...
ValueError: logprobs: the generation drew token id 5, but the tokenizer knows 3 tokens (ids 0-2) while the scores have 8 columns: the model's vocabulary is padded. Generate again with vocab_size=3 (or tokenizer=, whose size is then used), so that padding ids are never drawn.
"""  # noqa: E501 (the doctest's output line)

from __future__ import annotations

from typing import Any

__all__ = ["check_drawn_ids", "tokenizer_size"]


def tokenizer_size(tokenizer: Any) -> int | None:
    """One more than the highest token id `tokenizer` can produce, or None when it does not say.

    Reads a transformers tokenizer (`len`, and its added tokens, which may lie above it), a
    `tokenizers.Tokenizer` (`get_vocab_size`) or a tiktoken encoding (`n_vocab`).
    """
    if tokenizer is None:
        return None
    size = None
    n_vocab = getattr(tokenizer, "n_vocab", None)  # tiktoken: max_token_value + 1
    if isinstance(n_vocab, int) and not isinstance(n_vocab, bool):
        size = n_vocab
    elif callable(getattr(tokenizer, "get_vocab_size", None)):  # a `tokenizers.Tokenizer`
        size = int(tokenizer.get_vocab_size(with_added_tokens=True))
    elif callable(getattr(tokenizer, "__len__", None)):
        size = len(tokenizer)
    if size is None:
        return None
    added = getattr(tokenizer, "added_tokens_decoder", None)  # {id: AddedToken}, ids may lie above len()
    if isinstance(added, dict) and added:
        size = max(size, max(int(token_id) for token_id in added) + 1)
    return size if size > 0 else None


def check_drawn_ids(tokens: list[int], *, columns: int, tokenizer: Any, caller: str) -> None:
    """`ValueError` when a drawn token id is past `tokenizer`'s size: a padding column was drawn.

    `tokens` are the generated ids (a host list), `columns` the scores' width. Silent when the
    tokenizer covers every column, or says nothing of its size.
    """
    size = tokenizer_size(tokenizer)
    if size is None or size >= columns or not tokens or max(tokens) < size:
        return
    raise ValueError(
        f"{caller}: the generation drew token id {max(tokens)}, but the tokenizer knows {size} tokens "
        f"(ids 0-{size - 1}) while the scores have {columns} columns: the model's vocabulary is padded. "
        f"Generate again with vocab_size={size} (or tokenizer=, whose size is then used), so that padding ids "
        "are never drawn."
    )
