"""Which rows of `generate` are finished, read from the device at most once per step.

HF's `_sample` reads `unfinished_sequences.max() == 0` after every token, and hfbridge's own checks
(NaN rows, rows with nothing left to choose) would add reads of their own. On an accelerator each
read stalls the host until the device catches up. `FinishedRows` keeps all of it on the device:

- the per-row `unfinished` flags, updated by HF's stopping criteria every step (`MaxLengthCriteria`,
  which depends only on the length, is answered on the host);
- the validity flags of every step since the last read (`note_invalid`);

and reads them together, once, every `check_every` steps (and at the step where the length limit
ends the loop anyway, it reads nothing). Rows that finish keep receiving `pad_token_id`, so
decoding past the end changes no token: when the read finds every row finished, `finish_length`
tells where they finished and `generate` cuts the extra steps off.

With `synced_gpus`, the flags are summed over the ranks of `torch.distributed` at each read
(`_generate/lockstep.py`), and a rank whose rows are finished keeps calling its model until all are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import StoppingCriteriaList
from transformers.generation.stopping_criteria import MaxLengthCriteria

from hfbridge._generate import lockstep as _lockstep


class InvalidRows(Exception):
    """Raised by `FinishedRows.read` when a step had a row with nothing to choose (NaN or all -inf).

    `step` is the first such step, `row` the first such row in it and `rows` how many rows that
    step had invalid; `nan` is True when the row's best score was NaN (False: -inf everywhere).
    """

    def __init__(self, step: int, row: int, rows: int, nan: bool, explain: Callable[[], None] | None):
        super().__init__(f"row {row} invalid at step {step}")
        self.step, self.row, self.rows, self.nan, self.explain = step, row, rows, nan, explain


class FinishedRows:
    """The loop's view of which rows are finished and whether the last steps were valid.

    Args:
        rows: Sequences in the batch, N.
        device: Where the sequences live.
        criteria: HF's stopping criteria for the call (merged with the user's).
        check_every: Read the flags every this many steps (1: every step, as HF).
        synced: Keep this rank in lockstep with the other ranks of `torch.distributed`.

    >>> import torch
    >>> from transformers import StoppingCriteriaList, MaxLengthCriteria
    >>> done = FinishedRows(1, torch.device("cpu"), StoppingCriteriaList([MaxLengthCriteria(4)]))
    >>> done.after_step(torch.zeros(1, 3, dtype=torch.long), None, step=0)   # 3 < 4 tokens: go on
    False
    >>> done.after_step(torch.zeros(1, 4, dtype=torch.long), None, step=1)   # the limit: stop, no read
    True
    """

    def __init__(self, rows: int, device: torch.device, criteria: StoppingCriteriaList, *,
                 check_every: int = 1, synced: bool = False):
        self.unfinished = torch.ones(rows, dtype=torch.bool, device=device)  # [N]
        self.check_every = check_every
        self.synced = synced
        self.max_length, self.others = _split_criteria(criteria)
        self.rank_done = False  # this rank's rows are all finished (with `synced`: it now only keeps pace)
        self._window: list[tuple[int, int, torch.Tensor]] = []  # (step, length, unfinished) since the last read
        self._invalid: list[tuple[int, torch.Tensor, Callable[[], None] | None]] = []
        self._finish_length: int | None = None

    @property
    def finish_length(self) -> int | None:
        """The sequence length at which every row was finished, once a read has found that."""
        return self._finish_length

    def note_invalid(self, step: int, best: torch.Tensor, explain: Callable[[], None] | None = None) -> None:
        """Remember a step's per-row validity for the next read.

        Args:
            step: The step number (for the error).
            best: `(rows,)` float: the best score of each row (NaN or -inf: nothing to choose), or
                a `(rows,)` bool tensor that is True for invalid rows.
            explain: Called on the error path while this step is the current one, to raise the
                precise error (it may read the step's logits); None to raise the generic one.
        """
        self._invalid.append((step, best, explain))

    def pending(self) -> bool:
        """Whether steps since the last read still wait to be checked."""
        return bool(self._window or self._invalid)

    def after_step(self, sequences: torch.Tensor, scores: Any, *, step: int,
                   force_read: bool = False) -> bool:
        """Apply the stopping criteria to the sequences after `step`; True when the loop should stop.

        Reads the device only when a check is due (every `check_every` steps, or `force_read`),
        and not at all at the step where the length limit stops every row anyway.
        """
        length = sequences.shape[1]
        if self.others:
            self.unfinished = self.unfinished & ~self.others(sequences, scores)
        self._window.append((step, length, self.unfinished))
        if self.max_length is not None and length >= self.max_length:  # every row is finished
            if not self.rank_done:
                self._finish_length = self._first_finished_length(length)
                self.rank_done = True
            if not self.synced:
                self._check_invalid()  # the last step's flags: a read only when there are any
                self._window.clear()
                return True
        if not (self.others or self._invalid or self.synced):
            self._window.clear()
            return False  # nothing can have changed on the device: only the length limit ends this loop
        if not (force_read or self.synced or (step + 1) % self.check_every == 0):
            return False
        return self.read()

    def rewind(self, unfinished: torch.Tensor) -> None:
        """Rows were taken back (banned strings): `unfinished` `(rows,)` bool is now each row's state."""
        self.unfinished = unfinished
        self.rank_done = False
        self._finish_length = None
        self._window.clear()

    def read(self) -> bool:
        """One host read of everything pending; True when the loop should stop."""
        if self.others is None and not self.synced and len(self._invalid) == 1:
            # the common case (one step's validity, rows finished only by the length): fewest Python steps
            best = self._invalid[0][1]
            if _is_invalid(best, _read_together([], [best])[0]):
                self._raise_invalid()
            self._invalid.clear()
            self._window.clear()
            return self.rank_done
        parts: list[torch.Tensor] = []  # 0-d tensors, read together
        if self.synced:
            running = torch.zeros((), dtype=torch.bool, device=self.unfinished.device) if self.rank_done \
                else self.unfinished.any()
            parts.append(_lockstep.sum_over_ranks(running))  # how many ranks still have unfinished rows
        tracked = self.others is not None or self.synced  # else only the length limit finishes rows
        if tracked:
            parts.append(self.unfinished.any())
        values = _read_together(parts, [best for _, best, _ in self._invalid])
        if self.synced:
            everyone, values = values[0], values[1:]
        if any(_is_invalid(best, value) for (_, best, _), value in zip(self._invalid, values[int(tracked):])):
            self._raise_invalid()
        self._invalid.clear()
        if tracked and not values[0] and not self.rank_done:
            self.rank_done = True
            self._finish_length = self._first_finished_length(None)
        self._window.clear()
        if self.synced:
            return everyone == 0
        return self.rank_done

    def _check_invalid(self) -> None:
        if self._invalid:
            values = _read_together([], [best for _, best, _ in self._invalid])
            if any(_is_invalid(best, value) for (_, best, _), value in zip(self._invalid, values)):
                self._raise_invalid()
        self._invalid.clear()

    def _raise_invalid(self) -> None:
        """Find the first invalid step and row (error path: reads freely) and raise `InvalidRows`."""
        for step, best, explain in self._invalid:
            flags = _invalid_rows(best)
            if bool(flags.any()):
                row = int(flags.nonzero()[0, 0])
                nan = bool(best.isnan()[row]) if best.is_floating_point() else False
                raise InvalidRows(step, row, int(flags.sum()), nan, explain)
        raise AssertionError("unreachable: a read reported an invalid row")  # pragma: no cover

    def _first_finished_length(self, length: int | None) -> int:
        """The length after the first step of the window at which no row was unfinished."""
        if length is not None and not self.others:
            return length  # only the length limit can finish rows
        if len(self._window) == 1:
            return self._window[0][1]
        done = (~torch.stack([unfinished.any() for _, _, unfinished in self._window])).tolist()
        return next((entry[1] for entry, flag in zip(self._window, done) if flag), self._window[-1][1])


def _read_together(parts: list[torch.Tensor], bests: list[torch.Tensor]) -> list[float]:
    """One host read of the 0-d `parts` and a summary of each step's validity flags `bests`.

    A float `best` is summarised by its minimum (NaN or -inf: a row had nothing to choose; `amin`
    propagates NaN), a bool flag by `any`. One value alone is read without stacking.
    """
    if not parts and len(bests) == 1 and bests[0].numel() == 1:
        return [bests[0].item()]  # greedy, one row, nothing else to read: no extra op at all
    summaries = [best.any() if best.dtype == torch.bool else best.amin() for best in bests]
    values = parts + summaries
    if len(values) == 1:
        return [values[0].item()]
    return torch.stack([value.to(torch.float64) for value in values]).tolist() if _mixed(values) \
        else torch.stack(values).tolist()


def _mixed(values: list[torch.Tensor]) -> bool:
    return len({value.dtype for value in values}) > 1


def _is_invalid(best: torch.Tensor, value: float) -> bool:
    """Whether the summary `value` of a step's flags (see `_read_together`) shows an invalid row."""
    if best.dtype == torch.bool:
        return bool(value)
    return not value > float("-inf")


def _invalid_rows(best: torch.Tensor) -> torch.Tensor:
    """`(rows,)` True where a row has nothing to choose: its best score is NaN or -inf."""
    if best.dtype == torch.bool:
        return best
    return ~(best > float("-inf"))


def _split_criteria(criteria: StoppingCriteriaList) -> tuple[int | None, StoppingCriteriaList | None]:
    """HF's plain `MaxLengthCriteria` (answered on the host from the length) and the other criteria.

    A `MaxLengthCriteria` that may warn about `max_position_embeddings` stays a device criterion.
    """
    max_length = None
    others = StoppingCriteriaList()
    for criterion in criteria:
        if type(criterion) is MaxLengthCriteria and getattr(criterion, "max_position_embeddings", None) is None:
            max_length = criterion.max_length if max_length is None else min(max_length, criterion.max_length)
        else:
            others.append(criterion)
    return max_length, (others if len(others) else None)
