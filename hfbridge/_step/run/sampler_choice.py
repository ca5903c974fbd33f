"""The last stage of a `Sampler` step: the draw (HF's softmax and multinomial; the argmax is `greedy_choice`, which
`Sampler.step` runs on the route `_step/run/route.py` decides), and the
rows left with nothing to choose explained with exact mode's error (at once in exact mode; the fast path's
flag read by `check_rows`). `Sampler` (`_step/run/sampler.py`) inherits it.

>>> import torch
>>> from hfbridge._step.run.sampler import Sampler
>>> Sampler(do_sample=True, top_k=1).choose(torch.tensor([[0.0, 2.0, float("-inf")]])).tolist()
[1]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from transformers import LogitsProcessorList

from hfbridge._step.checks.row_errors import invalid_rows_error
from hfbridge._step.fast.fast_path import fast_draw
from hfbridge._step.run.exact_draw import draw_one, softmax
from hfbridge._step.run.per_row_draw import choose_rows, fast_rows
from hfbridge._step.run.processor_list import CheckedProcessorList, processor_name


class StepChoice:
    """The choice and its checks; `Sampler` provides the attributes and checks declared here."""

    _processors: Any
    _rows: Any
    _plan: Any
    _phases: Any
    _fast_valid: Any
    _last_fast: Any
    _fast_memo: dict[str, Any]
    _head_length: int
    _float_copy: Any  # `StepInputs._float_copy`
    generator: Any
    _generator_fits: Any
    do_sample: bool

    @property
    def _one_generator(self) -> torch.Generator | None:
        raise NotImplementedError

    def _check_generator(self, device: torch.device) -> None:
        """The generator (or each of a list) on the logits' device; checked once per generator and device."""
        fits = self._generator_fits
        if self.generator is None or (fits is not None and fits[0] is self.generator and fits[1] == device):
            return  # checked at the last step (twice a step in exact sampling: `prepare` and `choose`)
        for index, generator in enumerate(self.generator if isinstance(self.generator, (list, tuple))
                                          else [self.generator]):
            generator_device = torch.device(generator.device)
            if generator_device.type != device.type or (
                device.type != "cpu" and (generator_device.index or 0) != (device.index or 0)
            ):
                name = "generator" if isinstance(self.generator, torch.Generator) else f"generator[{index}]"
                raise ValueError(
                    f"`{name}` is on {generator_device} but the logits are on {device}; "
                    f"create it with torch.Generator(device={str(device)!r})."
                )
        self._generator_fits = (self.generator, device)

    def _check_rows_per_row(self, rows: int) -> None:
        raise NotImplementedError

    @property
    def invalid_rows(self) -> torch.Tensor | None:
        """`(rows,)` bool on the logits' device: True for each row the last fast `next_tokens` call
        could not sample (see `check_rows`); None before such a call. Reading it makes no host read."""
        if self._phases is not None:
            return self._phases.invalid  # the phases' fast samplers' flags, merged
        valid = self._fast_valid
        if isinstance(valid, bool):  # one CPU row whose draw knew the answer: no tensor made until asked
            return torch.tensor([not valid])
        return None if valid is None else ~valid

    def check_rows(self, invalid: bool | None = None) -> None:
        """Raise exact mode's error if the last fast `next_tokens` call left a row it could not sample.

        The fast path draws without a host-device sync, so it cannot raise by itself on an
        accelerator: it leaves `invalid_rows`, a `(rows,)` bool tensor on the logits' device, True
        for each row whose final scores hold NaN or `+inf` or nothing above `-inf` (exact mode's
        errors). This method is the point where that flag is read: `next_tokens` calls it at once
        on CPU and `Sampler.__call__` / `sample_step` always; `generate` folds the flag into its
        one host read per step and calls it with the value, naming the step. It also lets go of
        the step's scores kept for the error message. Exact mode has nothing to check here.

        Args:
            invalid: `bool(invalid_rows.any())` when the caller has already read it; default None
                reads it here (one host read).

        Raises:
            ValueError: exact mode's error for the first invalid row (NaN logits, NaN or `+inf`
                after the processors, or every token removed), naming the row.
        """
        if self._phases is not None:
            self._phases.check_rows(invalid)
            return
        last, self._last_fast = self._last_fast, None
        if last is None:
            return
        result, raw = last
        if invalid is None:
            known = result.known_valid  # the one-row CPU draw's answer: no op to read
            invalid = not known if known is not None else bool((~result.valid).any())
        if not invalid:
            return
        scores = result.final_scores()  # [N, V] HF's processed scores; invalid rows keep their cause
        self._raise_bad_rows(~result.valid, raw, scores)  # exact mode's own error (`_row_errors`)

    def _raise_bad_rows(self, bad: torch.Tensor, raw: torch.Tensor, scores: torch.Tensor | None = None) -> None:
        """Explain rows left with nothing to choose: NaN or +inf (sampling), or over-eager processors."""
        names = [processor_name(p) for p in self._processors]
        numbers = getattr(self, "row_numbers", None)  # a phase's rows of a larger batch (`_step/run/phases.py`)
        if numbers is not None:  # the error names the batch's rows: the others are spread in as valid zeros
            total, index = numbers
            bad, raw = _spread(bad, index, total), _spread(raw, index, total)
            scores = None if scores is None else _spread(scores, index, total)
        raise invalid_rows_error(raw, scores, sampling=self.do_sample, processor_names=names, bad=bad)

    row_numbers: tuple[int, torch.Tensor] | None = None  # (the batch's rows, (n,) this step's rows among them)

    def choose(self, scores: torch.Tensor, *, raw: torch.Tensor | None = None) -> torch.Tensor:
        """HF's draw: `softmax` then `torch.multinomial(num_samples=1)` (per-row groups: each group's own, a
        temperature of 0 greedy); the sampling step's choice (`Sampler.step` takes the argmax itself).

        Raises `ValueError` for a row with nothing left to choose (all -inf, or NaN), or with +inf;
        `raw`, the logits before processing, tells the model's NaN or +inf apart from the processors'.
        """
        self._check_generator(scores.device)
        if (self._plan is not None and self._plan.mixed) or isinstance(self.generator, (list, tuple)):
            self._check_rows_per_row(scores.shape[0])
            tokens, invalid = choose_rows(scores, self._rows.samples_on(scores.device), self.generator,
                                          self._rows.sample_rows())
            if invalid is not None:  # read by `choose_rows`, which drew nothing then
                self._raise_bad_rows(invalid, scores if raw is None else raw, scores)
            return tokens
        probs = softmax(scores)  # HF's softmax; on CPU into a reused buffer (no page faults on fresh memory)
        try:
            # torch.multinomial reads its input to refuse NaN / inf / all-zero rows (a host read we
            # cannot avoid); checking the rows before it would add a second one. On CPU `draw_one`
            # gives its tokens and leaves the generator as it does, with a logarithm per kept token only.
            return draw_one(probs, self._one_generator, softmax_output=True)
        except RuntimeError as error:
            failure = error
        self._check_best(scores.amax(dim=-1), scores, raw)  # names the row
        raise failure

    def _check_best(self, best: torch.Tensor, scores: torch.Tensor, raw: torch.Tensor | None) -> None:
        """One host read: is every row's best score finite (or +inf when greedy, HF's argmax)?"""
        if self.do_sample:  # False for -inf (nothing left), +inf and NaN
            valid = best.abs() < float("inf")
            if bool(valid.all()):
                return
        else:  # False for -inf and NaN; the minimum alone tells (amin propagates NaN)
            worst = float(best if best.numel() == 1 else best.amin())
            if worst > float("-inf"):
                return
            valid = best > float("-inf")
        self._raise_bad_rows(~valid, scores if raw is None else raw, scores)


    def _fast_tokens(self, input_ids: torch.Tensor, rows: torch.Tensor, processors: LogitsProcessorList
                     ) -> torch.Tensor:
        """The fused path's tokens; the rows' validity kept for `invalid_rows` / `check_rows` (no host read)."""
        # float32 rows are lent read-only: the fast path copies where it writes (a temperature's
        # division makes the copy), instead of a copy here and a division in place there
        lent = rows.dtype == torch.float32
        result: Any
        if self._plan is not None or isinstance(self.generator, (list, tuple)):  # per group, or per row
            result = self._fast_rows(input_ids, rows, processors, lent)
        else:
            result = fast_draw(input_ids, rows if lent else self._float_copy(rows), processors, self._one_generator,
                               memo=self._fast_memo, read_only=lent)
        known = result.known_valid  # the one-row CPU draw knows it on the host
        if known:  # valid, known without a read: nothing to keep for an error
            self._fast_valid, self._last_fast = True, None
        else:
            self._fast_valid = known if known is not None else result.valid  # no sync
            self._last_fast = (result, rows)
        return result.tokens

    def _fast_rows(self, input_ids: torch.Tensor, rows: torch.Tensor, processors: LogitsProcessorList, lent: bool,
                   head_output: torch.Tensor | None = None,
                   recorder: Callable[[Any, torch.Tensor], list] | None = None) -> Any:
        """The fast path per group (or per row): the chain's places before its first warper run once on the
        whole batch (guidance, penalties, your processors: exactly as exact mode runs them), then each
        group's own warpers, fused, on its rows alone (`per_row_draw.fast_rows`). `head_output`: those
        places' output when already computed; `recorder`: `(a group's processors, its rows' index) -> processors`
        wrapping them, so that `explain` records this very run."""
        start = self._head_length
        if head_output is not None:
            scores, lent = head_output, False
        elif start:
            head = CheckedProcessorList(processors[:start])
            scores, lent = head(cast(torch.LongTensor, input_ids), self._float_copy(rows)), False  # [N, V]
        else:
            scores = rows
        units = self._rows.units(processors, self.generator, rows.shape[0], rows.device, start)
        if recorder is not None:
            units = [(index, row_list, LogitsProcessorList(recorder(own, index)), samples, generator, memo)
                     for index, row_list, own, samples, generator, memo in units]
        return fast_rows(input_ids, scores, units, read_only=lent)


def _spread(part: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    """`part` `(n, ...)` at the rows `index` of a `(rows, ...)` tensor of zeros (False)."""
    whole = torch.zeros((rows, *part.shape[1:]), dtype=part.dtype, device=part.device)
    return whole.index_copy_(0, index.to(part.device), part)
