"""Logits layouts: which axis is the vocabulary, which is the sequence, which are batch axes.

A layout is an einops-style string of axis names: `v` is the vocabulary, `t` the sequence
(only its last position is used) and every other name a batch axis. `to_rows` turns logits of any
layout into `(rows, vocab)` rows, one per batch element, and `from_rows` gives per-row results
(tokens) the layout's batch shape back.

>>> import torch
>>> logits = torch.randn(5, 2, 7)                 # [T, B, V]
>>> rows, batch_shape = to_rows(logits, "t b v")
>>> rows.shape, batch_shape
(torch.Size([2, 7]), (2,))
>>> from_rows(rows.argmax(-1), batch_shape).shape
torch.Size([2])
"""

from __future__ import annotations

import math

import torch
from einops import rearrange

_DEFAULT_PATTERNS = {1: "v", 2: "b v", 3: "b t v"}
VOCAB_AXIS, SEQ_AXIS = "v", "t"


class Layout:
    """A parsed logits layout such as `"b t v"`, `"t b v"`, `"b v t"` or `"b k t v"`.

    Args:
        pattern: Axis names separated by spaces; `v` (vocabulary) exactly once, `t` (sequence)
            at most once, any other identifiers are batch axes.

    >>> Layout("b k t v").batch_axes
    ('b', 'k')
    """

    def __init__(self, pattern: str):
        if not isinstance(pattern, str):
            raise TypeError(f"`layout` must be a string such as 'b t v', got {type(pattern).__name__}.")
        axes = tuple(pattern.split())
        problem = _pattern_problem(axes)
        if problem:
            raise ValueError(f"`layout` {pattern!r} is not a valid layout: {problem}.")
        self.axes = axes
        self.pattern = " ".join(axes)
        self.batch_axes = tuple(axis for axis in axes if axis not in (VOCAB_AXIS, SEQ_AXIS))
        self.has_seq = SEQ_AXIS in axes

    @classmethod
    def for_tensor(cls, logits: torch.Tensor, layout: LayoutLike = None) -> Layout:
        """The given layout, or the default for `logits.ndim` (`"v"`, `"b v"`, `"b t v"`)."""
        if isinstance(layout, Layout):
            return layout
        if layout is None:
            if logits.ndim not in _DEFAULT_PATTERNS:
                raise ValueError(
                    f"logits of shape {tuple(logits.shape)} have {logits.ndim} axes and no default layout: "
                    f"pass `layout=`, e.g. 'b k t v' for [batch, codebooks, seq, vocab]."
                )
            layout = _DEFAULT_PATTERNS[logits.ndim]
        return cls(layout)

    def __repr__(self) -> str:
        return f"Layout({self.pattern!r})"

    def check(self, logits: torch.Tensor) -> None:
        """Raise `ValueError` when `logits` does not fit this layout (`TypeError` for a non-tensor)."""
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"`logits` must be a tensor, got {type(logits).__name__}.")
        if logits.ndim != len(self.axes):
            raise ValueError(
                f"`layout` {self.pattern!r} names {len(self.axes)} axes but the logits have shape "
                f"{tuple(logits.shape)} ({logits.ndim} axes)."
            )
        if 0 not in logits.shape:
            return
        for axis, size in zip(self.axes, logits.shape):
            if size == 0:
                raise ValueError(
                    f"logits of shape {tuple(logits.shape)} have an empty `{axis}` axis (layout {self.pattern!r})."
                )

    def batch_shape(self, logits: torch.Tensor) -> tuple[int, ...]:
        """Sizes of the batch axes, in layout order."""
        sizes = dict(zip(self.axes, logits.shape))
        return tuple(sizes[axis] for axis in self.batch_axes)

    def to_rows(self, logits: torch.Tensor) -> torch.Tensor:
        """Last-position logits as `(rows, vocab)`; a view where the strides allow it."""
        self.check(logits)
        axes = list(self.axes)
        if self.has_seq:
            # Select before rearranging so that a copy, if one is needed, holds one position only.
            logits = logits.select(axes.index(SEQ_AXIS), -1)
            axes.remove(SEQ_AXIS)
        if not self.batch_axes:
            return rearrange(logits, "v -> 1 v")
        batch = " ".join(self.batch_axes)
        return rearrange(logits, f"{' '.join(axes)} -> ({batch}) v")

    def from_rows(self, values: torch.Tensor, batch_shape: tuple[int, ...]) -> torch.Tensor:
        """Per-row values `(rows, ...)` back to `(*batch_shape, ...)`; 0-d for unbatched layouts."""
        return from_rows(values, batch_shape)


LayoutLike = str | Layout | None


def _pattern_problem(axes: tuple[str, ...]) -> str | None:
    if not axes:
        return "it names no axes"
    for axis in axes:
        if not axis.isidentifier():
            return f"axis name {axis!r} is not an identifier (write axes like 'b t v')"
    duplicates = sorted({axis for axis in axes if axes.count(axis) > 1})
    if duplicates:
        return f"axis {duplicates[0]!r} appears more than once"
    if VOCAB_AXIS not in axes:
        return "it has no vocabulary axis 'v'"
    return None


def to_rows(logits: torch.Tensor, layout: LayoutLike = None) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Last-position rows of `logits` and the batch shape to restore afterwards.

    Args:
        logits: Any layout; default layouts are `"v"` (1-D), `"b v"` (2-D) and `"b t v"` (3-D).
        layout: An einops-style axis string, e.g. `"t b v"`, `"b v t"`, `"b k t v"`.

    Returns:
        `(rows, batch_shape)`: rows of shape `(prod(batch_shape), vocab)` in the logits' dtype
        (a view where possible: copy before modifying), and the batch axes' sizes.

    >>> import torch
    >>> rows, shape = to_rows(torch.zeros(2, 3, 4, 10), "b k t v")
    >>> rows.shape, shape
    (torch.Size([6, 10]), (2, 3))
    """
    if not isinstance(logits, torch.Tensor):
        raise TypeError(
            f"`logits` must be a tensor (any layout, e.g. [batch, seq, vocab]), got {type(logits).__name__}; "
            "for a model output, take its logits first (sample_step accepts outputs as they are)."
        )
    parsed = Layout.for_tensor(logits, layout)
    return parsed.to_rows(logits), parsed.batch_shape(logits)


def from_rows(values: torch.Tensor, batch_shape: tuple[int, ...]) -> torch.Tensor:
    """Give per-row `values` of shape `(rows, ...)` the batch shape `to_rows` returned.

    >>> import torch
    >>> from_rows(torch.arange(6), (2, 3)).tolist()
    [[0, 1, 2], [3, 4, 5]]
    >>> from_rows(torch.tensor([4]), ()).shape
    torch.Size([])
    """
    _check_rows(values, batch_shape)
    if not batch_shape:
        return values[0]
    if len(batch_shape) == 1:
        return values  # already (rows, ...)
    names = [f"a{i}" for i in range(len(batch_shape))]
    sizes = dict(zip(names, batch_shape))
    return rearrange(values, f"({' '.join(names)}) ... -> {' '.join(names)} ...", **sizes)


def _check_rows(values: torch.Tensor, batch_shape: tuple[int, ...]) -> None:
    """`from_rows`'s arguments: a tensor with one row per element of the batch shape."""
    if isinstance(batch_shape, tuple) and isinstance(values, torch.Tensor) and values.ndim \
            and values.shape[0] == math.prod(batch_shape):
        return  # every step of every sample_step call passes here: keep it to one comparison
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"`values` must be a tensor of per-row values (rows, ...), got {type(values).__name__}.")
    if not isinstance(batch_shape, (tuple, list, torch.Size)) or not all(
            isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in batch_shape):
        raise TypeError(f"`batch_shape` must be a tuple of sizes (as `to_rows` returns), got {batch_shape!r}.")
    rows = math.prod(batch_shape)
    if values.ndim == 0 or values.shape[0] != rows:
        got = "a 0-d tensor" if values.ndim == 0 else f"{values.shape[0]} rows (shape {tuple(values.shape)})"
        raise ValueError(
            f"`values` must have one row per element of batch_shape {tuple(batch_shape)}: expected {rows} "
            f"row{'s' if rows != 1 else ''}, got {got}."
        )


def rows_of(input_ids: torch.Tensor, batch_shape: tuple[int, ...]) -> torch.Tensor:
    """`input_ids` of shape `(*batch_shape, seq)` as `(rows, seq)`; the caller checked the shape."""
    if not batch_shape:
        return rearrange(input_ids, "t -> 1 t")
    if len(batch_shape) == 1:
        return input_ids  # already (rows, seq)
    names = " ".join(f"a{i}" for i in range(len(batch_shape)))
    return rearrange(input_ids, f"{names} t -> ({names}) t")
