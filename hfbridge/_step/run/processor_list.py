"""HF's `LogitsProcessorList`, with every processor's output checked before the next one reads it.

A processor that returns `None` (it edited the scores in place and forgot to return them), a
tensor with other rows or columns, another dtype or another device would otherwise give a
silent wrong token or fail a step later deep inside torch. The checks read only metadata
(shape, dtype, device): they never wait for an accelerator.

>>> import torch
>>> processors = CheckedProcessorList([lambda ids, scores: scores[:, :2]])
>>> try:
...     processors(None, torch.zeros(1, 3))
... except ValueError as error:
...     print(error)
logits processor 0 (<lambda>) returned scores of shape (1, 2), expected (1, 3) like its input (rows, vocab).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

import torch
from transformers import LogitsProcessorList

from hfbridge._step.plan.processor_repr import processor_list_html, processor_list_repr

__all__ = ["BadProcessorOutput", "CheckedProcessorList", "Recorder", "check_processor_output", "processor_name"]

Recorder = Callable[[Any, torch.Tensor], None]  # (processor, (rows, vocab) scores after it), once per processor


class BadProcessorOutput(Exception):
    """Marks the errors of `check_processor_output`, so that `generate` can add the step to them."""


class ProcessorOutputTypeError(BadProcessorOutput, TypeError):
    """A processor returned no tensor, or scores of another dtype."""


class ProcessorOutputValueError(BadProcessorOutput, ValueError):
    """A processor returned scores of another shape, or on another device."""


class CheckedProcessorList(LogitsProcessorList):
    """A `LogitsProcessorList` whose call checks each processor's output (see `check_processor_output`).

    Items, order, equality and the keyword arguments passed to processors are HF's: each
    processor runs through HF's own `LogitsProcessorList.__call__`.

    >>> import torch
    >>> from transformers import TemperatureLogitsWarper
    >>> CheckedProcessorList([TemperatureLogitsWarper(0.5)])(None, torch.ones(1, 2)).tolist()
    [[2.0, 2.0]]
    """

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.run(input_ids, scores, **kwargs)

    def run(self, input_ids: torch.LongTensor, scores: torch.Tensor, *, record: Recorder | None = None,
            **kwargs: Any) -> torch.Tensor:
        """The list's call; `record(processor, scores)` after each processor, with a copy of its output (later
        processors may write into theirs): `Sampler.step(record=...)` and `explain_step` read the step so."""
        for index, processor in enumerate(self):
            if _takes_scores_only(processor):  # what HF's list does with it, without its `inspect.signature`
                output = processor(input_ids, scores)
            else:  # HF's own call for one processor: it decides which keyword arguments the processor takes
                output = LogitsProcessorList.__call__([processor], input_ids, scores, **kwargs)  # type: ignore[arg-type]
            scores = check_processor_output(processor, scores, output, index=index)
            if record is not None:
                record(processor, scores.clone())  # [N, V]
        return scores

    def __repr__(self) -> str:
        """Each processor with its settings, one a line (HF's processors have no repr of their own)."""
        return processor_list_repr(self, "LogitsProcessorList")

    def _repr_html_(self) -> str:
        """The same as a numbered list, for notebooks."""
        return processor_list_html(self, "LogitsProcessorList")


_SCORES_ONLY: dict[type, bool] = {}  # HF's processor classes -> their `__call__` takes (input_ids, scores) only


def _takes_scores_only(processor: Any) -> bool:
    """Whether HF's `LogitsProcessorList` calls `processor` as `processor(input_ids, scores)`, known
    without asking `inspect.signature` (which HF's list does for every processor at every step, a
    cost that grows once a step's large ops have evicted its code from the caches; figures in
    benchmarks/README.md). Only
    transformers' and hfbridge's own processor classes are remembered, by class, unless an instance
    carries its own `__call__`; anything else (a user's class, a subclass of ours in the user's module)
    goes through HF's list."""
    kind = type(processor)
    known = _SCORES_ONLY.get(kind)
    if known is None:
        module = kind.__module__
        ours = module == LogitsProcessorList.__module__ or module == "hfbridge" or module.startswith("hfbridge.")
        known = ours and len(inspect.signature(kind.__call__).parameters) == 3  # (self, input_ids, scores)
        _SCORES_ONLY[kind] = known
    return known and "__call__" not in getattr(processor, "__dict__", ())


def check_processor_output(processor: Callable, scores: torch.Tensor, output: Any, *, index: int | None = None
                           ) -> torch.Tensor:
    """`output` if it can stand for `scores` (a tensor of the same shape, dtype and device), else an error.

    Args:
        processor: The processor that was called (named in the error).
        scores: The `(rows, vocab)` scores it received; their metadata, read after the call, is
            what a processor editing in place leaves them with.
        output: What it returned.
        index: Its position in the list, for the error. Default: not shown.

    Raises:
        TypeError: `output` is not a tensor (`None` included), or has another dtype.
        ValueError: `output` has another shape or device.
        Both are also `BadProcessorOutput`.

    >>> import torch
    >>> scores = torch.zeros(2, 4)
    >>> check_processor_output(abs, scores, scores) is scores
    True
    """
    if output is scores:
        return output  # edited in place: the input's metadata is the output's
    if isinstance(output, torch.Tensor) and output.shape == scores.shape and output.dtype == scores.dtype \
            and output.device == scores.device:
        return output  # the common case: four metadata comparisons
    who = f"logits processor {index} ({processor_name(processor)})" if index is not None \
        else f"logits processor {processor_name(processor)}"
    if output is None:
        raise ProcessorOutputTypeError(
            f"{who} returned None; a processor must return the scores, `(input_ids, scores) -> scores` "
            "(one that edits them in place still ends with `return scores`)."
        )
    if not isinstance(output, torch.Tensor):
        raise ProcessorOutputTypeError(
            f"{who} returned {type(output).__name__}, expected the scores as a tensor of shape {tuple(scores.shape)}."
        )
    if output.shape != scores.shape:
        raise ProcessorOutputValueError(
            f"{who} returned scores of shape {tuple(output.shape)}, expected {tuple(scores.shape)} like its input "
            "(rows, vocab)."
        )
    if output.dtype != scores.dtype:
        raise ProcessorOutputTypeError(
            f"{who} returned scores of dtype {output.dtype}, expected {scores.dtype} like its input."
        )
    raise ProcessorOutputValueError(
        f"{who} returned scores on {output.device}, expected {scores.device} like its input."
    )


def processor_name(processor: Any) -> str:
    """A processor's name for messages: a function's own name, else its class name.

    >>> processor_name(len), processor_name(torch.nn.Identity())
    ('len', 'Identity')
    """
    if isinstance(processor, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return processor.__name__
    return type(processor).__name__
