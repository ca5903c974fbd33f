"""A model that cannot embed a token it was given: the mark of a padded vocabulary.

A model whose output has more columns than its embedding has rows (nanoGPT-style padding of
GPT-2's 50257 tokens to 50304 columns, with an embedding that stops at 50257) runs the prompt,
then draws a padding id and fails on it at the next call with torch's bare
`IndexError: index out of range in self`. `check_model_index_error` turns that into an error that
names the fix, `vocab_size=` (or `tokenizer=`, whose size is then used).

>>> import torch
>>> try:
...     check_model_index_error(IndexError("index out of range in self"), torch.tensor([[3, 70]]), step=1)
... except ValueError as error:
...     print(str(error)[:76])
generate(): at step 1 the model raised IndexError, fed token ids up to 70 (I
"""

from __future__ import annotations

import torch

__all__ = ["check_model_index_error"]


def check_model_index_error(error: BaseException, input_ids: torch.Tensor, step: int) -> None:
    """Raise a `ValueError` naming `vocab_size=` for an `IndexError` the model raised after the prompt.

    Step 0 (the prompt) is left alone: its ids are the caller's, not drawn. `input_ids` are the ids
    fed in the failing call; their maximum is read only here, on the error path.
    """
    if not isinstance(error, IndexError) or step < 1 or not isinstance(input_ids, torch.Tensor) \
            or input_ids.numel() == 0:
        return
    highest = int(input_ids.max())
    raise ValueError(
        f"generate(): at step {step} the model raised IndexError, fed token ids up to {highest} "
        f"(IndexError: {error}). A model whose logits have more columns than its embedding has rows (a padded "
        "vocabulary, as nanoGPT's 50304 columns for GPT-2's 50257 tokens) draws ids it cannot embed: pass "
        "vocab_size= (the number of real tokens), or tokenizer= (its size is then used), so that the padding is "
        "never chosen. If every id is below the embedding's size, the model's own index failed (positions past "
        "its context length?)."
    ) from error
