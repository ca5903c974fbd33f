"""CPU-only shortcuts, and the switch that turns them off to show what an accelerator runs.

On CPU a look at a value costs nothing (no device to wait for), and some steps are cheaper with
one: the fast path's candidate route checks a flag to skip its fixed-shape kernels (`fast/`);
greedy's argmax runs in numpy's vectorised kernel, several times faster than torch's CPU one
(`greedy_choice`); the prompt's id range is read on the host (`ids_outside`). On an
accelerator and under `torch.compile` none of them runs: no host read, no data-dependent control
flow. `accelerator_route()` turns them off on CPU too, so that tests and benchmarks count the
host reads an accelerator would see (each a host-device sync there).

>>> import torch
>>> rows = torch.tensor([[0.0, 2.0, 1.0], [3.0, 3.0, -1.0]])
>>> greedy_choice(rows)
(tensor([1, 0]), tensor([2., 3.]))
>>> with accelerator_route():
...     greedy_choice(rows)
(tensor([1, 0]), tensor([2., 3.]))
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import numpy
import torch

from hfbridge.processors._cpu_side import device_only

__all__ = ["accelerator_route", "cpu_shortcuts", "greedy_choice", "ids_outside"]

_ACCELERATOR_ROUTE: ContextVar[bool] = ContextVar("hfbridge_accelerator_route", default=False)
_NUMPY_DTYPES = (torch.float32, torch.float64)  # numpy's argmax is vectorised for these; not bfloat16
_LISTED_IDS = 64  # ids checked as a Python list up to this many (numpy beyond: benchmarks/README.md)


@contextlib.contextmanager
def accelerator_route() -> Iterator[None]:
    """Within it, hfbridge takes no CPU-only shortcut: CPU runs what an accelerator runs.

    The same tokens in greedy; in `fast=True` sampling the same distribution and surviving set
    through other kernels (so other draws for a seed). Usually slower on CPU.
    """
    token = _ACCELERATOR_ROUTE.set(True)
    try:
        with device_only():  # the processors' host paths too
            yield
    finally:
        _ACCELERATOR_ROUTE.reset(token)


def cpu_shortcuts(tensor: torch.Tensor) -> bool:
    """Whether a step on `tensor` may read its values on the host: CPU, eager, not `accelerator_route()`."""
    return tensor.device.type == "cpu" and not torch.compiler.is_compiling() and not _ACCELERATOR_ROUTE.get()


def greedy_choice(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rows,)` argmax token ids of `(rows, vocab)` scores and `(rows,)` their scores, as `rows.max(-1)`.

    The first index of the maximum, as `torch.argmax` (HF's greedy choice); a row holding NaN gives
    its first NaN, so the best score tells a row with nothing to choose (NaN or -inf). On CPU
    (float32/float64, eager) numpy's argmax does the work; `rows` is only read.
    """
    if rows.dtype in _NUMPY_DTYPES and cpu_shortcuts(rows):
        values = (rows.detach() if rows.requires_grad else rows).numpy()  # [N, V], the same memory
        tokens = values.argmax(axis=-1)  # [N]
        best = values[0, tokens] if len(tokens) == 1 else values[numpy.arange(len(tokens)), tokens]  # [N]
        ids = torch.from_numpy(tokens)
        return ids if ids.dtype == torch.long else ids.long(), torch.from_numpy(best)
    best, ids = rows.max(dim=-1)
    return ids, best


def ids_outside(ids: torch.Tensor, vocab: int) -> bool:
    """Whether integer `ids` (not empty) hold a value outside `[0, vocab)`, in one host read.

    On CPU a short prompt is read as a Python list, through numpy (no torch op): numpy's reduction,
    or a torch reshape, costs tens of times more when it runs cold, after a step's vocabulary-sized
    ops have evicted its code from the caches (benchmarks/README.md). Longer ones are read by numpy
    as unsigned, so that one maximum finds negative ids too.
    """
    if cpu_shortcuts(ids) and ids.dtype == torch.long:
        if ids.numel() <= _LISTED_IDS:
            listed = ids.numpy().ravel().tolist()
            return min(listed) < 0 or max(listed) >= vocab
        return int(numpy.maximum.reduce(ids.numpy().view(numpy.uint64), axis=None)) >= vocab
    low, high = torch.stack(torch.aminmax(ids)).tolist()
    return low < 0 or high >= vocab
