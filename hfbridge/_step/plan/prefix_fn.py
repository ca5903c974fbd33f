"""`prefix_allowed_tokens_fn`'s answers checked before HF's processor indexes the scores with them.

HF's `PrefixConstrainedLogitsProcessor` writes `mask[row, allowed] = 0` with whatever the function
returned. An id past the vocabulary fails deep inside torch (`IndexError`, naming neither the
function nor the row); a negative id silently allows a token counted from the end of the
vocabulary; a list of bools is read as a mask. Here each answer is checked first, and the error
names the function, the row, its `batch_id` and the value (`generate` adds the step).

>>> import torch
>>> processor = checked_prefix_processor(lambda batch_id, ids: [1, 9], num_beams=1)
>>> try:
...     processor(torch.tensor([[0, 1]]), torch.zeros(1, 4))
... except ValueError as error:
...     print(error)
prefix_allowed_tokens_fn (<lambda>) returned token id 9 for row 0 (batch_id 0), outside the vocabulary of 4 tokens (ids 0 to 3).
"""  # noqa: E501 (the doctest's output line)

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
from transformers import PrefixConstrainedLogitsProcessor as _HFPrefixConstrained

from hfbridge._step.run.processor_list import ProcessorOutputTypeError, ProcessorOutputValueError

__all__ = ["PrefixConstrainedLogitsProcessor", "checked_prefix_processor"]


class PrefixConstrainedLogitsProcessor(_HFPrefixConstrained):
    """HF's processor (same name, same masking) with each answer of the function checked."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        function = self._prefix_allowed_tokens_fn
        if isinstance(function, _CheckedFunction):
            function.start(scores.shape[-1])
        return super().__call__(input_ids, scores)


class _CheckedFunction:
    """The user's function, called as HF calls it; its answers checked against the step's vocabulary."""

    def __init__(self, function: Callable[[int, torch.Tensor], Any]):
        self.function = function
        self.name = getattr(function, "__name__", type(function).__name__)
        self.vocab: int | None = None
        self.row = 0

    def start(self, vocab: int) -> None:
        self.vocab, self.row = vocab, 0  # HF calls the function once per row, in row order

    def __call__(self, batch_id: int, input_ids: torch.Tensor) -> Any:
        row = self.row
        self.row += 1
        allowed = self.function(batch_id, input_ids)
        where = f"for row {row} (batch_id {batch_id})"
        who = f"prefix_allowed_tokens_fn ({self.name})"
        if isinstance(allowed, torch.Tensor):
            if allowed.ndim != 1 or allowed.is_floating_point() or allowed.dtype == torch.bool:
                raise ProcessorOutputTypeError(
                    f"{who} returned a tensor of shape {tuple(allowed.shape)} and dtype {allowed.dtype} {where}; "
                    "expected the allowed token ids, a list of ints (or a 1-d integer tensor)."
                )
            ids = allowed.tolist()  # one read: the function runs on the host anyway
        elif isinstance(allowed, (list, tuple, range)):
            ids = list(allowed)
            bad = next((item for item in ids if not isinstance(item, numbers.Integral) or isinstance(item, bool)),
                       None)
            if bad is not None:
                raise ProcessorOutputTypeError(
                    f"{who} returned a {type(allowed).__name__} holding {type(bad).__name__} {bad!r} {where}; "
                    "expected the allowed token ids as ints."
                )
        else:
            raise ProcessorOutputTypeError(
                f"{who} returned {type(allowed).__name__} {where}; expected the allowed token ids, a list of ints "
                "(return [] only for a row that can never go on)."
            )
        if ids:
            low, high = min(ids), max(ids)
            vocab = self.vocab
            outside = low if low < 0 else high if vocab is not None and high >= vocab else None
            if outside is not None:
                span = f"the vocabulary of {vocab} tokens (ids 0 to {vocab - 1})" if vocab is not None \
                    else "the vocabulary (ids start at 0)"
                raise ProcessorOutputValueError(f"{who} returned token id {outside} {where}, outside {span}.")
        return allowed


def checked_prefix_processor(function: Callable[[int, torch.Tensor], Any], num_beams: int
                             ) -> PrefixConstrainedLogitsProcessor:
    """HF's `PrefixConstrainedLogitsProcessor(function, num_beams)`, with the function's answers checked."""
    return PrefixConstrainedLogitsProcessor(_CheckedFunction(function), num_beams)


def with_checked_prefix(processors: list[Any]) -> list[Any]:
    """`processors` with HF's `PrefixConstrainedLogitsProcessor` items replaced by the checked one."""
    return [checked_prefix_processor(p._prefix_allowed_tokens_fn, p._num_beams)
            if type(p) is _HFPrefixConstrained else p for p in processors]
