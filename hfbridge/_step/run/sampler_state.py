"""What a `Sampler` keeps across steps, and a step recorded processor by processor.

`SamplerState` (inherited by `Sampler`) holds `StepResult` (what `Sampler.step` returns), and forwards
the stateful protocol (`processors/_stateful.py`: `reset`, `reorder`,
`rollback`) to every processor that keeps state per row, wherever it sits: in the chain, inside a
per-row group (`PerRowProcessor`), or copied for one row of a generator list. `explain` runs the
step once with each processor's output recorded and returns the step's own tokens (what
`explain_step` shows).

>>> import torch
>>> from hfbridge._step.run.sampler import Sampler
>>> sampler = Sampler(mirostat=2, mirostat_tau=1.0)
>>> tokens = sampler(torch.tensor([[0.0, 3.0, 1.0]]), torch.tensor([[0]]))
>>> sampler.is_stateful, sampler.processors[-1].mu.tolist()
(True, [2.0])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from transformers import LogitsProcessorList

from hfbridge._step.plan.option_table import sampling_processors
from hfbridge._step.run.cpu_shortcuts import greedy_choice
from hfbridge._step.run.processor_list import check_processor_output
from hfbridge._step.run.route import Route
from hfbridge.processors._stateful import is_stateful

__all__ = ["SamplerState", "StepResult", "first_warper", "invalid_flags"]


@dataclasses.dataclass
class StepResult:
    """What `Sampler.step` returns.

    Attributes:
        tokens: `(rows,)` int64 the chosen tokens.
        scores: `(rows, vocab)` the processed scores (exact path), or None (the fast path keeps none).
        invalid: `(rows,)` on the device, in the form `FinishedRows.note_invalid` reads: bool (True for a row
            with nothing to choose: the fast path), or each row's best score (NaN or -inf: nothing to choose:
            greedy); None when the step checked already (exact sampling's draw reads its input).
        explain: Raises exact mode's error for the invalid rows (reads the device); None with `invalid`.
    """

    tokens: torch.Tensor
    scores: torch.Tensor | None
    invalid: torch.Tensor | None
    explain: Callable[[], None] | None


def invalid_flags(invalid: torch.Tensor) -> torch.Tensor:
    """`StepResult.invalid` as `(rows,)` bool, True for a row with nothing to choose (a greedy step's best
    scores: NaN or -inf)."""
    return invalid if invalid.dtype == torch.bool else ~(invalid > float("-inf"))


class SamplerState:
    """The stateful protocol and `explain`; `Sampler` provides the attributes and stages declared here."""

    _processors: Any
    _rows: Any
    _plan: Any
    _phases: Any  # `_step/run/phases.Phases` with `thinking_options`, else None
    _batch_rows: int
    _head_length: int
    _fast_valid: Any
    _last_fast: Any
    generator: Any
    fast: bool
    do_sample: bool

    def _check_vocab(self, vocab: int) -> None:
        raise NotImplementedError

    def _processors_on(self, device: torch.device) -> Any:
        raise NotImplementedError

    def _check_rows_per_row(self, rows: int) -> None:
        raise NotImplementedError

    def _fast_rows(self, input_ids: torch.Tensor, rows: torch.Tensor, processors: Any, lent: bool,
                   head_output: torch.Tensor | None = None,
                   recorder: Callable[[Any, torch.Tensor], list] | None = None) -> Any:
        raise NotImplementedError

    def choose(self, scores: torch.Tensor, *, raw: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def _check_best(self, best: torch.Tensor, scores: torch.Tensor, raw: torch.Tensor | None) -> None:
        raise NotImplementedError

    def check_rows(self, invalid: bool | None = None) -> None:
        raise NotImplementedError

    @property
    def _one_generator(self) -> torch.Generator | None:
        raise NotImplementedError

    route: Callable[..., Route]
    _float_copy: Callable[[torch.Tensor], torch.Tensor]  # `StepInputs._float_copy`
    next_tokens: Callable[..., torch.Tensor]
    process: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    invalid_rows: Any
    _raise_bad_rows: Callable[..., None]

    _vocab_checked: int | None

    def explain_invalid(self, bad: torch.Tensor, raw: torch.Tensor, scores: torch.Tensor | None = None) -> None:
        """Raise exact mode's `ValueError` for the rows `bad` (`(rows,)` bool) left with nothing to choose:
        NaN or +inf in the model's logits `raw` (sampling), or processors that removed every token."""
        self._raise_bad_rows(bad, raw, scores)

    # ---- the stateful protocol, forwarded to every processor that keeps state per row ----

    def _stateful(self) -> list[tuple[Any, torch.Tensor | None]]:
        """`(processor, its rows or None for the whole batch)` for each processor that keeps state per row."""
        found: list[tuple[Any, torch.Tensor | None]] = []
        if self._phases is not None:  # the phases' samplers' (the wrapper's own list never runs)
            return [item for sampler in self._phases.samplers() for item in sampler._stateful()]
        for processor in self._processors:
            if is_stateful(processor):
                found.append((processor, None))
            for part, index in getattr(processor, "parts", ()):
                if part is not None and is_stateful(part):
                    found.append((part, index))
        for copied, row in self._rows.copies.values():
            found.append((copied, torch.tensor([row])))
        unique: dict[int, tuple[Any, torch.Tensor | None]] = {}
        for processor, index in found:  # a row's copy sits in the chain and in the copies: once
            unique.setdefault(id(processor), (processor, index))
        return list(unique.values())

    @property
    def is_stateful(self) -> bool:
        """Whether a processor of this sampler keeps state per row (mirostat): loops call `reset`,
        `reorder` and `rollback` then."""
        return bool(self._stateful())

    def reset(self) -> None:
        """Forget every row's state (a new sequence for every row): `sample_step` does this at each call."""
        for processor, _ in self._stateful():
            processor.reset()

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Row `i` now continues what row `beam_idx[i]` was (HF's beam reorder), for every stateful processor."""
        self._refuse_phases("reorder")
        for processor, index in self._stateful():
            processor.reorder(beam_idx if index is None else _local(beam_idx, index))

    def rollback(self, lengths: Any) -> None:
        """Each row now has `lengths[i]` tokens (an int: every row): its state goes back to that point."""
        self._refuse_phases("rollback")
        if not isinstance(lengths, torch.Tensor):
            lengths = torch.full((self._batch_rows,), int(lengths), dtype=torch.long)
        for processor, index in self._stateful():
            processor.rollback(lengths if index is None else lengths.index_select(0, index.to(lengths.device)))

    def _refuse_phases(self, what: str) -> None:
        if self._phases is not None:
            raise ValueError(f"`{what}` is not supported with `thinking_options`: each phase's sampler follows "
                             "its own rows, which beams and rolled-back rows would move; drop `thinking_options`, "
                             "or decode without beams, drafts and banned strings.")

    def explain(self, input_ids: torch.Tensor, rows: torch.Tensor
                ) -> tuple[list[tuple[Any, torch.Tensor]], torch.Tensor]:
        """One step that records what each processor did: `([(processor, (rows, vocab) scores after it)], tokens)`.

        Each processor runs once (a stateful one, yours included, takes one step); the tokens are the
        ones `next_tokens` returns for the same state and seed, exact or fast, per-row groups and
        generator lists included: with per-row groups or generator lists the step itself runs, group by
        group, with the processors not from transformers recorded as they run (`_explain_groups`); with one
        draw the fast path hands back their recorded outputs instead of running them again.
        `explain_step` is this, shown.

        >>> from hfbridge._step.run.sampler import Sampler
        >>> trace, tokens = Sampler(top_k=1, do_sample=True).explain(None, torch.tensor([[0.0, 3.0, 1.0]]))
        >>> [type(p).__name__ for p, _ in trace], tokens.tolist()
        (['TopKLogitsWarper'], [1])
        """
        if self._phases is not None:
            raise ValueError("a Sampler with `thinking_options` runs other processors per phase: call "
                             "`explain_phases` (explain_step does).")
        if rows.shape[-1] != self._vocab_checked:
            self._check_vocab(rows.shape[-1])
        processors = self._processors_on(rows.device)
        self._check_rows_per_row(rows.shape[0])
        self._batch_rows = rows.shape[0]
        route = self.route()
        ids = cast(torch.LongTensor, input_ids)
        scores = self._float_copy(rows)  # [N, V]
        outputs: list[tuple[Any, torch.Tensor]] = []
        grouped = route is Route.FAST and (self._plan is not None or isinstance(self.generator, (list, tuple)))
        # grouped: the head (the places before the first warper) here, the rest recorded as the step runs it
        for index, processor in enumerate(processors[:self._head_length] if grouped else processors):
            scores = check_processor_output(processor, scores, processor(ids, scores.clone()), index=index)
            outputs.append((processor, scores))
        if route is not Route.FAST:
            return outputs, self._choose_recorded(route, scores, rows)
        from hfbridge._step.fast.fast_path import fast_draw

        result: Any
        if grouped:
            result = self._explain_groups(ids, rows, processors, outputs)
        else:
            replayed = LogitsProcessorList(p if _from_transformers(p) else _Replay(output, None)
                                           for p, output in outputs)
            result = fast_draw(input_ids, self._float_copy(rows), replayed, self._one_generator)
        known = result.known_valid
        self._fast_valid = known if known is not None else result.valid
        self._last_fast = (result, rows)
        self.check_rows()
        return outputs, result.tokens


    def _choose_recorded(self, route: Route, scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The exact routes' choice on recorded scores, with their errors at once: the draw, or the argmax."""
        if route is Route.EXACT:
            return self.choose(scores, raw=rows)
        tokens, best = greedy_choice(scores)  # [N], [N]
        self._check_best(best, scores, rows)
        return tokens

    def explain_phases(self, input_ids: torch.Tensor, rows: torch.Tensor
                       ) -> tuple[dict[int, list[tuple[Any, torch.Tensor]]], torch.Tensor, list[bool], dict[int, bool]]:
        """`explain` with `thinking_options`: each phase's sampler explains its rows; `(each row's
        [(processor, (vocab,) scores after it)], (rows,) tokens, each row's phase (True: thinking), each row's
        do_sample)`; `explain_step` shows one row of it."""
        if self._phases is None:
            raise ValueError("`explain_phases` needs a Sampler with `thinking_options`; call `explain`.")
        if rows.shape[-1] != self._vocab_checked:
            self._check_vocab(rows.shape[-1])
        self._check_rows_per_row(rows.shape[0])
        return self._phases.explain(input_ids, rows)

    def _explain_groups(self, ids: torch.LongTensor, rows: torch.Tensor, processors: Any,
                        outputs: list[tuple[Any, torch.Tensor]]) -> Any:
        """The grouped fast step (per-row groups, or a generator per row) run as `next_tokens` runs it, recorded.

        `outputs` holds the head's outputs (the places before the first warper, run once on the whole batch, as the
        step runs them). The step then runs each group's processors in its own order and draws group after group
        from the generator (XTC's coins between the draws included), with every processor not from transformers
        recording the rows it produced; the rest of the trace is HF's pure processors run again on the whole batch
        and those recordings handed back, so nothing draws twice or steps twice and the token is the step's own.
        """
        start = self._head_length
        head = outputs[-1][1].clone() if start else None
        recorded: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

        def recorder(own: Any, index: torch.Tensor) -> list:
            return [p if _from_transformers(p) else _Recorder(p, index, recorded) for p in own]

        result = self._fast_rows(ids, rows, processors, False, head_output=head, recorder=recorder)
        scores = outputs[-1][1] if start else self._float_copy(rows)  # [N, V]
        for place, processor in enumerate(processors[start:], start):
            if _pure(processor):  # a function of (input_ids, scores): the same output again
                output = check_processor_output(processor, scores, processor(ids, scores.clone()), index=place)
            else:
                output = scores.clone()  # rows it never ran on (greedy rows, rows whose values leave it off) keep
                for leaf in self._leaves(processor):
                    for index, rows_out in recorded.get(leaf, ()):
                        output[index.to(output.device)] = rows_out
            outputs.append((processor, output))
            scores = output
        return result

    def _leaves(self, processor: Any) -> set[int]:
        """The ids of what runs in the step for one processor of the chain: itself, its groups' parts and the
        per-row copies of either."""
        leaves = {id(processor)} | {id(part) for part, _ in getattr(processor, "parts", ()) if part is not None}
        leaves |= {id(copied) for copied in getattr(processor, "by_row", {}).values()}
        return leaves | {id(copied) for (_, original), (copied, _) in self._rows.copies.items() if original in leaves}


def first_warper(processors: Sequence[Any]) -> int:
    """The place of the chain's first warper (HF's or ours, or a per-row one); the length when there is none."""
    warpers = sampling_processors() | {"PerRowTemperature"}
    for place, processor in enumerate(processors):
        if type(processor).__name__ in warpers or getattr(processor, "name", None) in warpers:
            return place
    return len(processors)


def _local(beam_idx: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`beam_idx` for the rows `index` of the batch, in their own numbering; a row of the group must
    continue a row of the same group (one host read, only for per-row groups of a stateful processor)."""
    index = index.to(beam_idx.device)
    position = torch.full((beam_idx.shape[0],), -1, dtype=torch.long, device=beam_idx.device)
    position[index] = torch.arange(index.shape[0], device=beam_idx.device)
    local = position[beam_idx.long().index_select(0, index)]
    if bool((local < 0).any()):
        raise ValueError("`reorder`: a row would continue a row with other per-row values; beams of one prompt "
                         "must share its values.")
    return local


class _Replay:
    """Stands in for a processor that already ran for this step: hands back (a copy of) its output's rows."""

    def __init__(self, output: torch.Tensor, index: torch.Tensor | None):
        self.output, self.index = output, index  # [N, V], (n,)

    def __call__(self, input_ids: Any, scores: torch.Tensor) -> torch.Tensor:
        if self.index is None or self.index.shape[0] == self.output.shape[0]:
            return self.output.clone()
        return self.output.index_select(0, self.index.to(self.output.device))  # [n, V]


class _Recorder:
    """Runs a processor not from transformers inside the step and keeps a copy of the rows it produced."""

    def __init__(self, processor: Any, index: torch.Tensor, recorded: dict[int, list]):
        self.processor, self.index, self.recorded = processor, index, recorded

    def __call__(self, input_ids: Any, scores: torch.Tensor) -> torch.Tensor:
        output = check_processor_output(self.processor, scores, self.processor(input_ids, scores))  # [n, V]
        self.recorded.setdefault(id(self.processor), []).append((self.index, output.clone()))  # the step writes on
        return output


def _pure(processor: Any) -> bool:
    """HF's processor, or a per-row split of HF's processors only: running it again gives the same output."""
    parts = getattr(processor, "parts", None)
    if parts is None or getattr(processor, "by_row", None) is not None:
        return _from_transformers(processor)
    return all(part is None or _from_transformers(part) for part, _ in parts)


def _from_transformers(processor: Any) -> bool:
    """HF's own processors are pure functions of `(input_ids, scores)`: running one twice is harmless."""
    return type(processor).__module__.split(".")[0] == "transformers"
