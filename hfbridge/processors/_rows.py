"""Per-row parameters: one value for every row, or one value per row, checked once on the host.

Every numeric parameter of the samplers in `hfbridge.processors` takes a scalar, a list or a 1-D
tensor of one value per row. The values are read once, at construction (a tensor is read there,
never at a step), checked with a message naming the parameter, and lent to each step as a `(rows,)`
tensor on the scores' device (made once per device, dtype and row count).

>>> param = RowParam("base", [1.5, 2.0], minimum=1.0)
>>> param.values, param.scalar
((1.5, 2.0), False)
>>> param.tensor(2, torch.device("cpu")).tolist()
[1.5, 2.0]
>>> RowParam("base", 0.5, minimum=1.0)
Traceback (most recent call last):
...
ValueError: `base` must be >= 1.0, got 0.5.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch

from hfbridge.processors._cpu_side import fused_path, host_path, scores_owned

__all__ = ["RowParam", "best_k", "cut_below", "described", "finite_count", "gate", "plain", "token_label"]


def described(value: Any) -> str:
    """A short `type value` text for error messages.

    >>> described("x"), described(True)
    ("str 'x'", 'bool True')
    """
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def plain(value: Any) -> Any:
    """A NumPy value as Python's (`np.float32(0.5)` -> 0.5, an array -> a list); anything else as it is.

    >>> import numpy as np
    >>> plain(np.int64(3)), plain(np.array([0.5, 1.0])), plain([1]), plain(np.array(["top_k", "min_p"]))
    (3, [0.5, 1.0], [1], ['top_k', 'min_p'])
    """
    if isinstance(value, torch.Tensor) or not (hasattr(value, "ndim") and hasattr(value, "tolist")):
        return value
    if getattr(value, "dtype", None) is not None and getattr(value.dtype, "kind", "") in "biufU":
        return value.tolist()  # NumPy's bool, ints, floats and strings; the checks below refuse bools
    return value


def row_label(name: str, index: int | None) -> str:
    """How an option (or one row's value of it) is named in a message.

    >>> row_label("top_p", None), row_label("top_p", 1)
    ('`top_p`', '`top_p[1]` (row 1)')
    """
    return f"`{name}`" if index is None else f"`{name}[{index}]` (row {index})"


def rows_mismatch(name: str, values: int, rows: int, what: str = "the scores have") -> ValueError:
    """The error for one value per row given for another number of rows."""
    return ValueError(f"`{name}` has {values} values, one per row, but {what} {rows} rows; pass one value per row, "
                      "or a single number for every row.")


# A removed token's score, -inf, clamped to this, counts -1 / _BIG in a row's sum: the sum then tells
# how many there are without a boolean pass (a comparison and a boolean sum cost about 8 reads of the
# scores on CPU, the clamp and the sum about 3).
_BIG = 1e30


def finite_count(scores: torch.Tensor) -> torch.Tensor:
    """`(rows, 1)` float: how many scores of each row are above `-inf` (scores shifted to `<= 0`).

    Finite scores are assumed far above `-1e30`, and their sum far below `1e29` in size (logits).

    >>> finite_count(torch.tensor([[0.0, -1.0, -float("inf")], [-2.0, 0.0, -5.0]])).tolist()
    [[2.0], [3.0]]
    """
    if torch.finfo(scores.dtype).max < _BIG:  # float16: -1e30 is out of its range; count in float32
        return finite_count(scores.float()).to(scores.dtype)
    removed = (scores.clamp(min=-_BIG).sum(-1, keepdim=True) / -_BIG).round()
    return (scores.shape[-1] - removed).clamp(min=1)


def gate(values: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """`0.0` where `values >= floor` (per row), `-inf` below: add it to scores to remove those tokens.

    The same as `torch.where(values >= floor, 0.0, -inf)` (a NaN value stays NaN), in float passes only:
    on CPU a comparison and a masked write cost about 15 reads of the scores, these four about 6.
    Differences are scaled by 1e30 first, so that the smallest negative one clears the cut at -1e-20.

    >>> gate(torch.tensor([[1.0, 2.0, 3.0, -float("inf")]]), torch.tensor([[2.0]])).tolist()
    [[-inf, 0.0, 0.0, -inf]]
    """
    if torch.finfo(values.dtype).max < _BIG:  # float16: the 1e30 scale is out of its range; gate in float32
        return gate(values.float(), floor.float()).to(values.dtype)
    floor = floor.clamp(min=torch.finfo(values.dtype).min)  # a floor of -inf keeps every value but -inf
    shifted = (values - floor).clamp_(max=0.0).mul_(1e30)  # 0 where kept, < -1e-15 (or -inf) where not
    return torch.nn.functional.threshold(shifted, -1e-20, -torch.inf, inplace=True)


_CUT_VOCAB = 2048  # narrower rows: the per-row loop's fixed cost beats the saving


def cut_below(scores: torch.Tensor, floor: torch.Tensor, value: float = -torch.inf) -> torch.Tensor | None:
    """`scores` with each row's scores below `floor[row]` set to `value`; None where this path does not apply.

    One pass over the scores on the host path (`fused_path`, `floor` finite, rows of at least 2,048):
    `torch.threshold` per row keeps `x > nextafter(floor, -inf)`, which for a value of the scores'
    dtype is `x >= floor`, and writes into the scores themselves when they are owned
    (`scores_owned()`), else into a fresh tensor. A NaN score stays NaN. Callers use `gate` otherwise.

    >>> scores = torch.tensor([[0.5, 1.0, 2.0] * 1000])
    >>> cut_below(scores, torch.tensor([[1.0]]))[0, :3].tolist()
    [-inf, 1.0, 2.0]
    """
    if scores.ndim != 2 or scores.shape[-1] < _CUT_VOCAB or not fused_path(scores) or not host_path(floor):
        return None
    below = torch.nextafter(floor.to(scores.dtype), torch.tensor(-torch.inf, dtype=scores.dtype)).flatten()
    bounds = below.tolist()  # a host read: free on CPU
    if not all(-torch.inf < bound < torch.inf for bound in bounds):
        return None
    out = scores if scores_owned() else torch.empty_like(scores, memory_format=torch.contiguous_format)
    for row, bound in enumerate(bounds):
        torch.threshold(scores[row], bound, value, out=out[row])
    return out


_BLOCK = 128  # columns per block of the prefilter


def best_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` largest scores per row and their ids, as `topk` (values exact; ties in any order).

    The k blocks of 128 columns with the largest maxima hold the k largest values (a value outside
    them is at most the k-th largest block maximum, so k other values are at least as large), so
    `topk` runs on those blocks (and the last, partial one) instead of the whole row: one read of the
    scores for the block maxima, then a few thousand candidates.

    >>> values, ids = best_k(torch.tensor([[0.5, 3.0, 1.0, 2.0]]), 2)
    >>> values.tolist(), ids.tolist()
    ([[3.0, 2.0]], [[1, 3]])
    """
    rows, vocab = scores.shape  # [B, V]
    blocks = vocab // _BLOCK
    if blocks <= 4 * k:
        values, ids = scores.topk(k, dim=-1)
        return values, ids
    main = blocks * _BLOCK
    chosen = scores[:, :main].reshape(rows, blocks, _BLOCK).amax(-1).topk(k, dim=-1).indices  # [B, k] blocks
    columns = (chosen[:, :, None] * _BLOCK + torch.arange(_BLOCK, device=scores.device)).flatten(1)  # [B, k*128]
    if main < vocab:
        tail = torch.arange(main, vocab, device=scores.device).expand(rows, -1)
        columns = torch.cat([columns, tail], dim=1)
    values, where = scores.gather(1, columns).topk(k, dim=-1)
    return values, columns.gather(1, where)


class RowParam:
    """A checked parameter: one value, or one per row.

    Args:
        name: The parameter's name, used in every error message.
        value: An int or float, a list / tuple of them, or a 1-D tensor.
        integer: Values must be ints (a float such as `2.0` is refused).
        minimum / maximum: Inclusive bounds. `above` / `below`: exclusive bounds.
        check: An extra test, `value -> error text or None`, for the rules bounds cannot say.
    """

    def __init__(self, name: str, value: Any, *, integer: bool = False, minimum: float | None = None,
                 maximum: float | None = None, above: float | None = None, below: float | None = None,
                 check: Callable[[float], str | None] | None = None):
        self.name = name
        value = plain(value)
        self.scalar = not (isinstance(value, (list, tuple)) or (isinstance(value, torch.Tensor) and value.ndim == 1))
        items = _as_items(name, value)
        kind = "an int" if integer else "a number"
        for index, item in enumerate(items):
            where = row_label(name, None if self.scalar else index)
            if isinstance(item, bool) or not isinstance(item, numbers.Real) or (
                integer and not isinstance(item, numbers.Integral)
            ):
                raise TypeError(f"{where} must be {kind}, got {described(item)}.")
            if not math.isfinite(item):
                raise ValueError(f"{where} must be a finite number, got {item!r}.")
            for bound, ok, text in ((minimum, lambda v, b: v >= b, ">="), (maximum, lambda v, b: v <= b, "<="),
                                    (above, lambda v, b: v > b, ">"), (below, lambda v, b: v < b, "<")):
                if bound is not None and not ok(item, bound):
                    raise ValueError(f"{where} must be {text} {bound}, got {item!r}.")
            problem = check(float(item)) if check is not None else None
            if problem:
                raise ValueError(f"{where} {problem}, got {item!r}.")
        self.values: tuple[Any, ...] = tuple(int(v) if integer else float(v) for v in items)
        self._tensors: dict[tuple, torch.Tensor] = {}

    def __repr__(self) -> str:
        return repr(self.values[0] if self.scalar else list(self.values))

    def for_rows(self, rows: int) -> tuple[Any, ...]:
        """The values for `rows` rows (a scalar repeated); `ValueError` when a list has another length."""
        if self.scalar:
            return self.values * rows
        if len(self.values) != rows:
            raise rows_mismatch(self.name, len(self.values), rows)
        return self.values

    def tensor(self, rows: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """`(rows,)` values on `device`; made once per (rows, device, dtype), no host read."""
        key = (rows, device, dtype)
        cached = self._tensors.get(key)
        if cached is None:
            cached = torch.tensor(self.for_rows(rows), dtype=dtype, device=device)
            self._tensors[key] = cached
        return cached

    def all(self, test: Callable[[Any], bool]) -> bool:
        """Whether every value passes `test` (host values: no device read)."""
        return all(test(v) for v in self.values)

    def any(self, test: Callable[[Any], bool]) -> bool:
        """Whether some value passes `test`."""
        return any(test(v) for v in self.values)


def _as_items(name: str, value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        if value.ndim > 1:
            raise TypeError(f"`{name}` must be a number or one number per row (a list, a tuple or a 1-D tensor), "
                            f"got a {value.dtype} tensor of shape {tuple(value.shape)}.")
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"`{name}` must be a number or one number per row (a list, a tuple or a 1-D tensor), "
                            f"got a {value.dtype} tensor of shape {tuple(value.shape)}.")
        items = value.detach().cpu().reshape(-1).tolist()  # once, at construction
        if value.is_floating_point():
            items = [float(v) for v in items]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        return [value]
    if not items:
        raise ValueError(f"`{name}` is empty; pass a number, or one number per row.")
    return items


def token_label(token: int) -> str:
    """A token shown without a tokenizer, as the samplers' `describe_last` records write it: `#id`.

    >>> token_label(42)
    '#42'
    """
    return f"#{token}"
