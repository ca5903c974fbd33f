"""Whether a processor may take a host path (NumPy on the tensor's memory) for a CPU tensor.

On CPU a host read costs nothing (no device to wait for), and for a few rows NumPy on views beats a
chain of torch kernels. `device_only()` turns such paths off, so that CPU runs what an accelerator
runs (hfbridge's `accelerator_route()` enters it; tests count host reads inside it).

>>> import torch
>>> host_path(torch.zeros(2)), host_path(torch.zeros(2), torch.zeros(2))
(True, True)
>>> with device_only():
...     host_path(torch.zeros(2))
False
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch

__all__ = ["device_only", "host_path"]

_DEVICE_ONLY: ContextVar[bool] = ContextVar("hfbridge_processors_device_only", default=False)


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
    return (not _DEVICE_ONLY.get() and not torch.compiler.is_compiling()
            and all(tensor.device.type == "cpu" for tensor in tensors))
