"""Count host reads of tensor values (host-device syncs on an accelerator), on any device, CPU included.

A `TorchDispatchMode` sees every aten op; the ones that hand a tensor's value to the host (or
need one to size their output) are what stalls the host on a GPU until the device catches up.
`.tolist()`, `.numpy()` and `__array__` read the memory without an aten op on CPU, so they are
counted by wrapping those methods while the counter is active.

>>> import torch
>>> with HostReads() as reads:
...     x = torch.arange(4)
...     _ = bool(x.max() == 3), x.nonzero(), x.tolist()
>>> reads.count, sorted(reads.ops)
(3, ['_local_scalar_dense', 'nonzero', 'tolist'])
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops (by overload packet name) that read a value on the host or size their output by the data.
SYNCING_OPS = frozenset({
    "_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "argwhere", "masked_select",
    "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive",
    "bincount", "histc", "multinomial",  # multinomial checks its probabilities with a host read
    "_assert_scalar",
})
# Indexing with a boolean mask runs `nonzero` inside the kernel.
_MASK_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
_READ_METHODS = ("tolist", "numpy", "__array__")


class HostReads(TorchDispatchMode):
    """Counts host reads of tensor values while active: `count` and `ops` (a `Counter` by op name)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self._saved: dict[str, Any] = {}

    @property
    def count(self) -> int:
        return sum(self.ops.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNCING_OPS:
            self.ops[name] += 1
        elif name in _MASK_INDEXING and _has_bool_index(args):
            self.ops[f"{name} (bool mask)"] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for method in _READ_METHODS:
            original = getattr(torch.Tensor, method)
            self._saved[method] = original

            def counted(tensor, *args, _original=original, _method=method, **kwargs):
                self.ops[_method] += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, method, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for method, original in self._saved.items():
            setattr(torch.Tensor, method, original)
        self._saved.clear()
        return super().__exit__(*exc)


def _has_bool_index(args) -> bool:
    if len(args) < 2 or not isinstance(args[1], (list, tuple)):
        return False
    return any(isinstance(index, torch.Tensor) and index.dtype == torch.bool for index in args[1])
