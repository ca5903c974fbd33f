"""The first stages of a `Sampler` step: the caller's logits and ids, checked and flattened to rows.

`StepInputs` (one per `Sampler`, which hands it what it needs) runs both in `prepare`: `last_rows` (extract,
layout, vocabulary trim: a view of the caller's logits) and `input_rows` (the context ids, checked against
those rows); `float_copy` makes the float32 copy the processors work on. It owns the layout, the vocabulary
limits and the token options checked against the vocabulary's width.

>>> import torch
>>> inputs = StepInputs(None, vocab_size=2)
>>> view, ids, batch = inputs.prepare(torch.zeros(1, 4, 3), torch.tensor([[0, 1, 1, 0]]))
>>> tuple(view.shape), tuple(ids.shape), batch
((1, 2), (1, 4), (1,))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from hfbridge._step.checks.caller_inputs import check_not_meta, extract_logits
from hfbridge._step.checks.option_checks import check_token_ids_in_vocab
from hfbridge._step.run.cpu_shortcuts import ids_outside
from hfbridge._step.run.layout import Layout, LayoutLike, rows_of

__all__ = ["StepInputs", "float_copy"]


def float_copy(rows: torch.Tensor) -> torch.Tensor:
    """`(rows, vocab)` float32 as HF upcasts; a copy, so that in-place processors never reach the caller's tensor."""
    return rows.to(dtype=torch.float32, copy=True)


class StepInputs:
    """The caller's logits and ids, checked and flattened to rows (see the module).

    Args:
        layout: The logits' layout (a `Layout`, a pattern, or None: the default for the number of axes).
        vocab_size: The real vocabulary (columns past it dropped), or None.
        tokenizer_vocab: Without `vocab_size`, the tokenizer's size: columns past it are padding.
        token_options: Token ids of the options (`{name: ids}`), checked against the vocabulary's width.
    """

    def __init__(self, layout: Layout | LayoutLike, vocab_size: int | None = None, tokenizer_vocab: int | None = None,
                 token_options: Mapping[str, Any] | None = None) -> None:
        self.layout = layout
        self.vocab_size = vocab_size
        self.tokenizer_vocab = tokenizer_vocab
        self.token_options = dict(token_options or {})
        self.layouts: dict[tuple[str | None, int], Layout] = {}  # parsed layouts by (pattern, number of axes)
        self.known_call: tuple | None = None  # (signature, layout, batch_shape) of the last call `prepare` passed
        self.vocab_checked: int | None = None  # the width the token options were last checked against
        self.ids_copied = True  # the step's ids are a private copy (False: no processor could write them)

    def check_vocab(self, vocab: int) -> None:
        """Token ids in the options must lie in `[0, vocab)`; checked once per width."""
        if vocab != self.vocab_checked:
            check_token_ids_in_vocab(self.token_options, vocab)
            self.vocab_checked = vocab

    def prepare(self, logits: Any, input_ids: torch.Tensor | None = None, *,
                check_generator: Callable[[torch.device], None] = lambda device: None
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
        """Check a step's arguments and flatten them: `(rows, ids, batch_shape)`.

        `rows` is the last-position `(rows, vocab)` view of the caller's logits (padded vocabulary
        dropped; read it, never write it), `ids` a private `(rows, seq)` int64 copy of
        `input_ids` (not copied when no processor could write them), and `batch_shape` the layout's
        batch axes (`from_rows` restores them).

        Tensors with the last call's shapes, dtypes and devices skip the checks that only those decide
        (the layout, the axes, the ids' batch): a loop's steps differ in the ids' values and length only,
        and those are checked every time. `check_generator(device)` raises unless the generator fits the
        logits' device.
        """
        if type(logits) is torch.Tensor and type(input_ids) is torch.Tensor:
            signature = (self.layout, logits.shape, logits.dtype, logits.device, input_ids.shape[:-1],
                         input_ids.ndim, input_ids.dtype, input_ids.device)
            known = self.known_call
            if known is not None and known[0] == signature:
                _, layout, batch_shape = known
                check_generator(logits.device)  # a generator set since then (`with_generator` copies)
                view = self._last_rows(logits, layout)  # [N, V], the caller's memory
                vocab = view.shape[1]
                self.check_vocab(vocab)
                return view, self._step_ids(rows_of(input_ids, batch_shape), vocab), batch_shape
        else:
            signature = None
        logits = extract_logits(logits)
        check_generator(logits.device)
        check_not_meta(logits)
        layout = self.layout_of(logits)
        layout.check(logits)
        batch_shape = layout.batch_shape(logits)
        view = self._last_rows(logits, layout)  # [N, V], the caller's memory
        ids = self.input_rows(input_ids, view, batch_shape=batch_shape)
        if signature is not None:  # every check passed: the same signature needs only the ids' values next time
            self.known_call = (signature, layout, batch_shape)
        return view, ids, batch_shape

    def layout_of(self, logits: torch.Tensor) -> Layout:
        """The sampler's layout, or the default one for `logits.ndim` (parsed once per pattern and number of axes)."""
        if isinstance(self.layout, Layout):
            return self.layout
        key = (self.layout, logits.ndim)  # the pattern too: `layout` may be set again after a step
        layout = self.layouts.get(key)
        if layout is None:
            layout = Layout.for_tensor(logits, self.layout)
            self.layouts[key] = layout
        return layout

    def last_rows(self, logits: torch.Tensor) -> torch.Tensor:
        """The last-position `(rows, vocab)` logits, padded vocabulary dropped: a view, no copy.

        Raises `ValueError` for a layout that does not fit, or too few columns for `vocab_size`.
        """
        layout = self.layout_of(logits)
        layout.check(logits)
        return self._last_rows(logits, layout)

    def vocab_limit(self, columns: int) -> int | None:
        """How many of `columns` vocabulary columns a step keeps (None: all), `vocab_size` or the tokenizer's size."""
        if self.vocab_size is not None:
            return self.vocab_size
        known = self.tokenizer_vocab
        return known if known is not None and columns > known else None

    def rows(self, logits: Any, *, nan_allowed: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A float32 copy of the last-position logits as `(rows, vocab)`, padded vocabulary dropped, and the
        `(rows,)` bool NaN rows, None when there are none or `nan_allowed` (HF's `remove_invalid_values`)."""
        logits = extract_logits(logits)
        check_not_meta(logits)
        rows = float_copy(self.last_rows(logits))
        if nan_allowed:
            return rows, None
        bad = torch.isnan(rows.amax(dim=-1))  # amax propagates NaN: one pass finds NaN rows
        return rows, (bad if bool(bad.any()) else None)

    def _last_rows(self, logits: torch.Tensor, layout: Layout) -> torch.Tensor:
        if layout.axes == ("b", "t", "v"):
            rows = logits.select(1, -1)  # [N, V_padded]: `to_rows` for the common layout, without einops' overhead
        elif layout.axes == ("b", "v"):
            rows = logits
        else:
            rows = layout.to_rows(logits)  # [N, V_padded], a view where possible
        columns = rows.shape[-1]
        if self.vocab_size is None:
            known = self.tokenizer_vocab
            return rows[:, :known] if known is not None and columns > known else rows  # padding past the tokenizer
        if self.vocab_size > columns:
            raise ValueError(
                f"`vocab_size`={self.vocab_size} but the logits have only {columns} vocabulary columns "
                f"(shape {tuple(logits.shape)})."
            )
        return rows[:, : self.vocab_size]

    def input_rows(self, input_ids: torch.Tensor | None, rows: torch.Tensor | int,
                   *, batch_shape: tuple[int, ...] | None = None, device: torch.device | None = None) -> torch.Tensor:
        """`input_ids` as `(rows, seq)` int64 (a private copy where needed), checked against the logits rows.

        When no processor could write them (none, or only HF's own option-built processors:
        `caller_inputs.keeps_ids_intact`), they are not copied (a view of `input_ids` when already int64).

        Args:
            input_ids: `(*batch, seq)` token ids, or None (no context: an empty `(rows, 0)` tensor).
            rows: The `(rows, vocab)` scores from `rows()` (or just the number of rows).
            batch_shape: The logits' batch shape; default `(rows,)`, or `()` for 1-D `input_ids`.
            device: The ids' device when `rows` is a number (the processors'; default CPU).
        """
        n_rows = rows if isinstance(rows, int) else rows.shape[0]
        vocab = None if isinstance(rows, int) else rows.shape[1]
        if vocab is not None:
            self.check_vocab(vocab)
        device = (device or torch.device("cpu")) if isinstance(rows, int) else rows.device
        if input_ids is None:
            return torch.empty((n_rows, 0), dtype=torch.long, device=device)
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"`input_ids` must be a tensor of token ids, got {type(input_ids).__name__}.")
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise TypeError(f"`input_ids` must hold integer token ids, got dtype {input_ids.dtype}.")
        if batch_shape is None:
            batch_shape = () if input_ids.ndim == 1 and n_rows == 1 else (n_rows,)
        if tuple(input_ids.shape[:-1]) != tuple(batch_shape) or input_ids.ndim != len(batch_shape) + 1:
            raise ValueError(
                f"`input_ids` of shape {tuple(input_ids.shape)} do not match the logits: expected "
                f"{tuple(batch_shape) + ('seq',)} (logits batch {tuple(batch_shape)}, {n_rows} rows), "
                f"got batch {tuple(input_ids.shape[:-1])}."
                + (" 1-D logits (vocab,) are one row, whose input_ids are 1-D (seq,): pass input_ids[0], or "
                   "logits[None] for a batch of one." if not batch_shape and input_ids.ndim == 2 else "")
            )
        if input_ids.device != device:
            raise ValueError(
                f"`input_ids` are on {input_ids.device} but the logits are on {device}; move one of them."
            )
        return self._step_ids(rows_of(input_ids, tuple(batch_shape)), vocab)

    def _step_ids(self, ids: torch.Tensor, vocab: int | None) -> torch.Tensor:
        """`(rows, seq)` ids as the step's int64 ids (a private copy for processors that might write them:
        user code; none for HF's own), their values checked against `vocab` (None: not known yet)."""
        if self.ids_copied or ids.dtype != torch.long:  # else no `to`: even a no-op is a dispatched call
            ids = ids.to(dtype=torch.long, copy=self.ids_copied)
        if vocab is not None and ids.numel() and ids_outside(ids, vocab):  # one pass, one host read
            bad = int(ids[(ids < 0) | (ids >= vocab)][0])
            raise ValueError(
                f"`input_ids` hold token id {bad}, outside the vocabulary of {vocab} tokens "
                f"(ids must be in [0, {vocab}); vocab_size={self.vocab_size}"
                + (f", the tokenizer's size, {self.tokenizer_vocab}: pass vocab_size= to keep more columns"
                   if self.vocab_size is None and vocab == self.tokenizer_vocab else "") + ")."
                + (f" The vocabulary is read from the logits' last axis ({vocab}); if it is another axis (logits "
                   "[batch, vocab, seq]), say so with layout=, e.g. layout=\"b v t\"."
                   if bad >= vocab and self.vocab_size is None and vocab != self.tokenizer_vocab else "")
            )
        return ids
