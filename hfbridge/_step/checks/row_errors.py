"""The errors for a row with nothing valid to choose, worded once for every path that detects one.

Exact mode (`Sampler.choose`, `Sampler.rows`) and the fast path raise the same texts. Each
function returns the exception (the caller raises it, adding the step in `generate`); they
only run once a row is known to be bad, so the host reads they make cost nothing per step.

>>> raw = torch.tensor([[0.0, 1.0], [float("nan"), 0.0]])
>>> print(invalid_rows_error(raw, sampling=True))  # doctest: +NORMALIZE_WHITESPACE
`logits` contain NaN in row 1 (1 of 2 rows have NaN); check the model's forward pass
(NaN comes from inf - inf, 0 * inf or 0 / 0 upstream).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["emptied_row_error", "inf_row_error", "invalid_rows_error", "nan_row_error"]


def nan_row_error(row: int, count: int, rows: int, *, source: str = "logits") -> ValueError:
    """NaN in `row` (`count` of `rows` rows have NaN), from the model's logits or from the processors."""
    if source == "logits":
        return ValueError(
            f"`logits` contain NaN in row {row} ({count} of {rows} rows have NaN); check the model's forward pass "
            "(NaN comes from inf - inf, 0 * inf or 0 / 0 upstream)."
        )
    return ValueError(
        f"the logits processors {source} turned row {row} into NaN ({count} of {rows} rows); the logits "
        "were finite, so a processor divided by zero or subtracted inf from inf."
    )


def inf_row_error(row: int, count: int, rows: int, *, source: str = "logits") -> ValueError:
    """+inf in `row` while sampling: softmax turns it into NaN, so no token can be drawn."""
    where = "`logits` contain +inf" if source == "logits" else f"the logits processors {source} left +inf"
    return ValueError(
        f"{where} in row {row} ({count} of {rows} rows) while sampling: softmax of +inf is NaN, so no token can "
        "be drawn (greedy decoding takes the +inf token, as HF's argmax). +inf usually means an fp16 overflow in "
        "the model: compute the last layer in float32, or clamp the logits."
    )


def emptied_row_error(row: int, processor_names: Iterable[str]) -> ValueError:
    """Every score of `row` is -inf after the processors (or was from the start)."""
    return ValueError(
        f"the logits processors {list(processor_names)} removed every token of row {row}: nothing is left to "
        "choose (a row can also start all -inf or NaN). Relax the options, e.g. `bad_words_ids`, "
        "`suppress_tokens` or `min_p`."
    )


def invalid_rows_error(raw: torch.Tensor, scores: torch.Tensor | None = None, *, sampling: bool,
                       processor_names: Iterable[str] = (), bad: torch.Tensor | None = None) -> ValueError:
    """The error for the first invalid row, worked out on the host once a check found one.

    Args:
        raw: `(rows, vocab)` logits before the processors.
        scores: `(rows, vocab)` scores after them, when the path has them (the fast path may not).
        sampling: Whether tokens are drawn; +inf is only an error then.
        processor_names: The processors' names, in order, for the messages.
        bad: `(rows,)` bool, the rows known to be invalid. Default: found from `scores` (or `raw`).

    Returns:
        The `ValueError` to raise for the first bad row: NaN in the logits, NaN made by the
        processors, +inf (sampling; in the logits or made by the processors), else a row with
        every token removed.
    """
    names = list(processor_names)
    final = scores if scores is not None else raw  # [N, V]
    n_rows = raw.shape[0]
    if bad is None:
        best = final.amax(dim=-1)  # [N]; NaN propagates
        bad = ~(best > float("-inf"))
        if sampling:
            bad |= best == float("inf")
    bad = bad.to(raw.device)
    raw_nan = torch.isnan(raw).any(dim=-1) & bad  # [N]
    if bool(raw_nan.any()):
        return nan_row_error(_first(raw_nan), int(raw_nan.sum()), n_rows)
    final_nan = torch.isnan(final).any(dim=-1) & bad
    raw_inf = (raw == float("inf")).any(dim=-1)  # [N]; a processor's inf - inf turns +inf logits into NaN
    if sampling and bool((final_nan & raw_inf).any()):
        rows = final_nan & raw_inf
        return inf_row_error(_first(rows), int(rows.sum()), n_rows)
    final_nan &= ~raw_inf
    if bool(final_nan.any()):
        return nan_row_error(_first(final_nan), int(final_nan.sum()), n_rows, source=str(names))
    if sampling:
        final_inf = (final == float("inf")).any(dim=-1) & bad
        if bool(final_inf.any()):
            row = _first(final_inf)
            from_logits = bool((raw[row] == float("inf")).any())
            return inf_row_error(row, int(final_inf.sum()), n_rows, source="logits" if from_logits else str(names))
    return emptied_row_error(_first(bad) if bool(bad.any()) else 0, names)


def _first(flags: torch.Tensor) -> int:
    return int(flags.nonzero()[0, 0])
