"""What a processor may do beyond its contract: a host path for CPU tensors, writing into owned scores.

On CPU a host read costs nothing (no device to wait for), and for a few rows NumPy on views beats a
chain of torch kernels. `device_only()` turns such paths off, so that CPU runs what an accelerator
runs (hfbridge's `accelerator_route()` enters it; tests count host reads inside it).

A processor leaves the scores it is given untouched (transformers' `generate` keeps them). Inside
`owned_scores()` the scores are the caller's private copy, as hfbridge's `Sampler` runs its chain on its
own float32 copy: a processor may then write into them and return them, saving a pass over the
vocabulary and a fresh tensor.

>>> import torch
>>> host_path(torch.zeros(2)), host_path(torch.zeros(2), torch.zeros(2))
(True, True)
>>> with device_only():
...     host_path(torch.zeros(2))
False
>>> with owned_scores():
...     scores_owned()
True
>>> scratch(torch.zeros(2, 3)).shape
torch.Size([2, 3])
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar

import numpy as np
import torch

__all__ = ["device_only", "fused_path", "host_copy", "host_path", "owned_scores", "row_copy", "scores_owned", "scratch",
           "zeroed"]

_DEVICE_ONLY: ContextVar[bool] = ContextVar("hfbridge_processors_device_only", default=False)
_OWNED: ContextVar[bool] = ContextVar("hfbridge_processors_owned_scores", default=False)
_SCRATCH = threading.local()  # per thread: the last scratch buffer made, and the last zeroed one


class owned_scores:  # lower case: used as the function it replaced, `with owned_scores():`
    """Within it, the scores processors receive are the caller's private copy: they may write into them.

    A class, not `contextlib.contextmanager`: the fast path enters it once per processor per step, and
    a generator-based context costs several times more."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _OWNED.set(True)

    def __exit__(self, *exc: object) -> None:
        _OWNED.reset(self._token)


def scores_owned() -> bool:
    """Whether the scores being processed may be written in place (see `owned_scores`)."""
    return _OWNED.get()


@contextlib.contextmanager
def device_only() -> Iterator[None]:
    """Within it, processors take no host path: CPU runs the kernels an accelerator runs."""
    token = _DEVICE_ONLY.set(True)
    try:
        yield
    finally:
        _DEVICE_ONLY.reset(token)


def host_path(*tensors: torch.Tensor) -> bool:
    """Whether every tensor is on the CPU, eager (not traced by `torch.compile`), outside `device_only()`."""
    if _DEVICE_ONLY.get():
        return False
    for tensor in tensors:  # a loop, not `all(...)`: every processor asks, every step
        if not tensor.is_cpu:
            return False
    return not torch.compiler.is_compiling()


def fused_path(scores: torch.Tensor) -> bool:
    """Whether a sampler may take its fused host path on `scores`: `host_path`, float32 or float64 rows,
    at least one row, no autograd graph (`out=` and in-place ops refuse tensors that require grad)."""
    return (scores.ndim == 2 and scores.shape[0] > 0 and scores.dtype in (torch.float32, torch.float64)
            and not scores.requires_grad and host_path(scores))


def host_copy(scores: torch.Tensor) -> torch.Tensor:
    """A private copy of CPU scores: NumPy's copy for one float32 or float64 row, else `clone`.

    One row is the case where the step's fixed costs dominate: run cold (after a model's forward pass
    or another step's vocabulary-sized work) NumPy's few calls cost microseconds less than torch's
    dispatched `clone`. Larger batches keep `clone` (a large copy may use torch's threads).

    >>> host_copy(torch.ones(1, 3)).tolist()
    [[1.0, 1.0, 1.0]]
    """
    if (scores.ndim == 2 and scores.shape[0] == 1 and scores.dtype in (torch.float32, torch.float64)
            and not scores.requires_grad and scores.is_cpu):
        return row_copy(scores)[0]
    return scores.clone()


def row_copy(scores: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """`host_copy` of one float32 or float64 CPU row without autograd (the caller has checked): the private
    `(1, V)` tensor and its `(V,)` NumPy view, for a caller that writes through the view.

    >>> copy, row = row_copy(torch.ones(1, 3))
    >>> row[0] = 5.0
    >>> copy.tolist()
    [[5.0, 1.0, 1.0]]
    """
    row = scores.numpy()[0].copy()  # [V]
    return torch.from_numpy(row[None]), row


def scratch(like: torch.Tensor) -> torch.Tensor:
    """An uninitialised buffer shaped like `like`, for values that do not leave one processor call.

    On the host path, this thread's one scratch buffer (made again when the shape or dtype changes):
    on CPU a fresh vocabulary-sized tensor costs about as much as three reads of the scores (page
    faults on new memory), a reused one nothing. Elsewhere a fresh one (an accelerator's caching
    allocator reuses memory already). Every processor shares it: never return it, nor keep it past
    the call, nor call another processor while holding it.
    """
    if not host_path(like):
        return torch.empty_like(like)
    held = getattr(_SCRATCH, "buffer", None)
    if held is None or held.shape != like.shape or held.dtype != like.dtype:
        held = _SCRATCH.buffer = torch.empty_like(like, memory_format=torch.contiguous_format)
    return held


@contextlib.contextmanager
def zeroed(like: torch.Tensor) -> Iterator[torch.Tensor]:
    """This thread's buffer of zeros shaped like `like` (host path only), for counts added at a few places.

    The holder must set every place it wrote back to 0 before leaving; if it leaves by an exception the
    buffer is dropped (it may hold counts). Per thread, so that two threads running the same processor
    never count into one buffer; shared by every processor of the thread, as `scratch`.
    """
    held = getattr(_SCRATCH, "zeros", None)
    if held is None or held.shape != like.shape or held.dtype != like.dtype:
        held = torch.zeros_like(like, memory_format=torch.contiguous_format)
    _SCRATCH.zeros = None  # taken: a call nested in this one gets its own
    yield held  # an exception leaves it dropped
    _SCRATCH.zeros = held
