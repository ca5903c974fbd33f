"""The first stages of a `Sampler` step: the caller's logits and ids, checked and flattened to rows.

`prepare` runs both: `last_rows` (extract, layout, vocabulary trim: a view of the caller's logits)
and `input_rows` (the context ids, checked against those rows); `rows` makes the float32 copy the
processors work on. `Sampler` (`_step/run/sampler.py`) inherits them and adds the processors and the draw.

>>> import torch
>>> from hfbridge._step.run.sampler import Sampler
>>> view, ids, batch = Sampler(vocab_size=2).prepare(torch.zeros(1, 4, 3), torch.tensor([[0, 1, 1, 0]]))
>>> tuple(view.shape), tuple(ids.shape), batch
((1, 2), (1, 4), (1,))
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig

from hfbridge._step.checks.caller_inputs import check_not_meta, extract_logits
from hfbridge._step.run.cpu_shortcuts import ids_outside
from hfbridge._step.run.layout import Layout, LayoutLike, rows_of


class StepInputs:
    """The input stages of a step; `Sampler` provides the attributes and checks declared here."""

    layout: Layout | LayoutLike
    _layouts: dict[tuple[str | None, int], Layout]
    vocab_size: int | None
    _tokenizer_vocab: int | None  # the tokenizer's size when `vocab_size` is None (`_step/plan/padded_vocab.py`)
    generation_config: GenerationConfig
    _vocab_checked: int | None
    _device: torch.device
    _ids_copied: bool
    _known_call: tuple | None  # (signature, layout, batch_shape) of the last call that passed `prepare`'s checks

    def _check_generator(self, device: torch.device) -> None:
        raise NotImplementedError

    def _check_vocab(self, vocab: int) -> None:
        raise NotImplementedError

    def _raise_bad_rows(self, bad: torch.Tensor, raw: torch.Tensor, scores: torch.Tensor | None = None) -> None:
        raise NotImplementedError

    def prepare(self, logits: Any, input_ids: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
        """Check a step's arguments and flatten them: `(rows, ids, batch_shape)`.

        `rows` is the last-position `(rows, vocab)` view of the caller's logits (padded vocabulary
        dropped; read it, never write it), `ids` a private `(rows, seq)` int64 copy of
        `input_ids` (not copied when no processor could write them), and `batch_shape` the layout's
        batch axes (`from_rows` restores them).

        Tensors with the last call's shapes, dtypes and devices skip the checks that only those decide
        (the layout, the axes, the ids' batch): a loop's steps differ in the ids' values and length only,
        and those are checked every time.
        """
        if type(logits) is torch.Tensor and type(input_ids) is torch.Tensor:
            signature = (self.layout, logits.shape, logits.dtype, logits.device, input_ids.shape[:-1],
                         input_ids.ndim, input_ids.dtype, input_ids.device)
            known = self._known_call
            if known is not None and known[0] == signature:
                _, layout, batch_shape = known
                self._check_generator(logits.device)  # a generator set since then (`with_generator` copies)
                view = self._last_rows(logits, layout)  # [N, V], the caller's memory
                vocab = view.shape[1]
                if vocab != self._vocab_checked:
                    self._check_vocab(vocab)
                return view, self._step_ids(rows_of(input_ids, batch_shape), vocab), batch_shape
        else:
            signature = None
        logits = extract_logits(logits)
        self._check_generator(logits.device)
        check_not_meta(logits)
        layout = self.layout_of(logits)
        layout.check(logits)
        batch_shape = layout.batch_shape(logits)
        view = self._last_rows(logits, layout)  # [N, V], the caller's memory
        ids = self.input_rows(input_ids, view, batch_shape=batch_shape)
        if signature is not None:  # every check passed: the same signature needs only the ids' values next time
            self._known_call = (signature, layout, batch_shape)
        return view, ids, batch_shape

    def layout_of(self, logits: torch.Tensor) -> Layout:
        """The sampler's layout, or the default one for `logits.ndim` (parsed once per pattern and number of axes)."""
        if isinstance(self.layout, Layout):
            return self.layout
        key = (self.layout, logits.ndim)  # the pattern too: `layout` may be set again after a step
        layout = self._layouts.get(key)
        if layout is None:
            layout = Layout.for_tensor(logits, self.layout)
            self._layouts[key] = layout
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
        known = self._tokenizer_vocab
        return known if known is not None and columns > known else None

    def rows(self, logits: Any) -> torch.Tensor:
        """A float32 copy of the last-position logits as `(rows, vocab)`, padded vocabulary dropped.

        Raises `ValueError` for a layout that does not fit, too few columns for `vocab_size`, or NaN.
        """
        logits = extract_logits(logits)
        check_not_meta(logits)
        rows = self._float_copy(self.last_rows(logits))
        if self.generation_config.remove_invalid_values:
            return rows  # HF's InfNanRemoveLogitsProcessor turns NaN into 0: the processed scores are checked
        bad = torch.isnan(rows.amax(dim=-1))  # amax propagates NaN: one pass finds NaN rows
        if bool(bad.any()):
            self._raise_bad_rows(bad, rows, rows)
        return rows

    def _last_rows(self, logits: torch.Tensor, layout: Layout) -> torch.Tensor:
        if layout.axes == ("b", "t", "v"):
            rows = logits.select(1, -1)  # [N, V_padded]: `to_rows` for the common layout, without einops' overhead
        elif layout.axes == ("b", "v"):
            rows = logits
        else:
            rows = layout.to_rows(logits)  # [N, V_padded], a view where possible
        columns = rows.shape[-1]
        if self.vocab_size is None:
            known = self._tokenizer_vocab
            return rows[:, :known] if known is not None and columns > known else rows  # padding past the tokenizer
        if self.vocab_size > columns:
            raise ValueError(
                f"`vocab_size`={self.vocab_size} but the logits have only {columns} vocabulary columns "
                f"(shape {tuple(logits.shape)})."
            )
        return rows[:, : self.vocab_size]

    @staticmethod
    def _float_copy(rows: torch.Tensor) -> torch.Tensor:
        # float32 as HF upcasts; copy=True so that in-place processors never reach the caller's tensor.
        return rows.to(dtype=torch.float32, copy=True)

    def input_rows(self, input_ids: torch.Tensor | None, rows: torch.Tensor | int,
                   *, batch_shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """`input_ids` as `(rows, seq)` int64 (a private copy where needed), checked against the logits rows.

        When no processor could write them (none, or only HF's own option-built processors:
        `caller_inputs.keeps_ids_intact`), they are not copied (a view of `input_ids` when already int64).

        Args:
            input_ids: `(*batch, seq)` token ids, or None (no context: an empty `(rows, 0)` tensor).
            rows: The `(rows, vocab)` scores from `rows()` (or just the number of rows).
            batch_shape: The logits' batch shape; default `(rows,)`, or `()` for 1-D `input_ids`.
        """
        n_rows = rows if isinstance(rows, int) else rows.shape[0]
        vocab = None if isinstance(rows, int) else rows.shape[1]
        if vocab is not None and vocab != self._vocab_checked:
            self._check_vocab(vocab)
        device = self._device if isinstance(rows, int) else rows.device
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
        if self._ids_copied or ids.dtype != torch.long:  # else no `to`: even a no-op is a dispatched call
            ids = ids.to(dtype=torch.long, copy=self._ids_copied)
        if vocab is not None and ids.numel() and ids_outside(ids, vocab):  # one pass, one host read
            bad = int(ids[(ids < 0) | (ids >= vocab)][0])
            raise ValueError(
                f"`input_ids` hold token id {bad}, outside the vocabulary of {vocab} tokens "
                f"(ids must be in [0, {vocab}); vocab_size={self.vocab_size}"
                + (f", the tokenizer's size, {self._tokenizer_vocab}: pass vocab_size= to keep more columns"
                   if self.vocab_size is None and vocab == self._tokenizer_vocab else "") + ")."
                + (f" The vocabulary is read from the logits' last axis ({vocab}); if it is another axis (logits "
                   "[batch, vocab, seq]), say so with layout=, e.g. layout=\"b v t\"."
                   if bad >= vocab and self.vocab_size is None and vocab != self._tokenizer_vocab else "")
            )
        return ids
