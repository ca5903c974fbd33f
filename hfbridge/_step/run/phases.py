"""Phase-aware sampling: other options while a row is thinking (`thinking_options=`).

A row is **thinking** while its last start tag (`thinking_start`, e.g. `<think>`) is not closed by an end
tag (`thinking_end`) after it; a prompt may open the span. While thinking, a row's step uses the call's
options updated with `thinking_options`; otherwise, the call's options. The phase is a function of the
tokens (`processors.thinking_budget.span_open`), computed on the device for every row at every step;
with a thinking budget, the end tag it forces closes the span like any other.

How a step runs (`Phases`): a `Sampler` per phase, built once (`units`): one for the whole batch, or,
with one value per row (of the options or of `thinking_options`) or a list of generators, one per group of
rows with the same values (one per row with a generator list). When every phase is greedy and keeps no state
but the budget's (a function of the tokens), both phases run on every row and each row's token is picked by its
phase on the device, with no host read. Otherwise each step reads the rows' phases once (the only host read it
adds) and runs each phase's sampler on its rows alone, so every row's token is the one a
hand loop gets by calling that phase's sampler on that row (`sample_step` with the row's options for its
phase): stateful samplers (mirostat, adaptive-p, the budget) keep one state per phase, following their
rows by their tokens. With one generator (or the global RNG) shared by the rows, the draws happen unit
by unit in the order of their first rows, and in each unit the answering rows first, then the thinking
ones.

>>> import torch
>>> from hfbridge._step.run.sampler import Sampler
>>> sampler = Sampler(thinking_options={"temperature": 0.7}, thinking_start=[7], thinking_end=[8])
>>> sampler.phased, [phase.do_sample for phase in sampler._phases.units[0].samplers]
(True, [False, True])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig

from hfbridge._step.plan.option_table import per_row_options
from hfbridge._step.plan.per_row import PerRowValues
from hfbridge._step.plan.phase_options import PHASE_NAMES, split_options, thinking_config, thinking_tag
from hfbridge._step.run.route import Route
from hfbridge._step.run.sampler_state import StepResult, invalid_flags
from hfbridge.processors.thinking_budget import span_open

__all__ = ["PHASE_NAMES", "Phases", "phases_of"]


@dataclass
class _Unit:
    """Rows that share their samplers: `rows` (None: every row), and the sampler of each phase."""

    rows: list[int] | None
    samplers: tuple[Any, Any]  # (answering, thinking)


class Phases:
    """A `Sampler`'s two phases (see the module): `units`, the tags, the last step's phases.

    Args:
        units: The rows and their two samplers each.
        start: The start tag's ids; `end`: the end tag's.
    """

    def __init__(self, units: list[_Unit], start: list[int], end: list[int]):
        self.units = units
        self.start, self.end = start, end
        self._tags: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._indices: dict[tuple[int, torch.device], torch.Tensor] = {}
        self.last: list[bool] | None = None  # each row's phase at the last step (True: thinking)
        self.invalid: torch.Tensor | None = None  # [N] bool: the last `next_tokens`' fast rows with nothing to choose
        # Every phase greedy and following nothing but the tokens: `step` runs both phases on every row and picks
        # each row's token by its phase on the device, with no host read (a draw, or a state fed by a
        # distribution, would see rows of the other phase there).
        self.without_read = all(not sampler.do_sample and all(
            type(processor).__name__ == "ThinkingBudgetLogitsProcessor" for processor, _ in sampler._stateful())
            for sampler in self.samplers())

    @classmethod
    def build(cls, config: GenerationConfig, per_row: PerRowValues | None, thinking: dict[str, Any],
              generator: Any, tokenizer: Any, prepare: Callable[[dict[str, Any]], GenerationConfig],
              make: Callable[[GenerationConfig, Any], Any]) -> Phases:
        """The units for the prepared `config` (the call's options; `per_row`: its values per row) and
        `thinking` (checked by `check_thinking_options`). `prepare(options)` prepares the call's config again
        with `options` over the call's own (`do_sample` among them: the caller's when absent), as the
        caller's options updated with them would be; `make(config, generator)` builds a `Sampler`."""
        start, end = (thinking_tag(name, getattr(config, name, None) or default, tokenizer)
                      for name, default in (("thinking_start", "<think>"), ("thinking_end", "</think>")))
        scalars, inside_rows = split_options("thinking_options", thinking)
        carried = {name: getattr(config, name) for name in per_row_options()
                   if isinstance(getattr(config, name, None), (list, tuple))}  # the community's, on the config
        counts = {len(values) for values in carried.values()}
        counts |= {per_row.rows} if per_row is not None else set()
        counts |= {inside_rows.rows} if inside_rows is not None else set()
        counts |= {len(generator)} if isinstance(generator, (list, tuple)) else set()
        if len(counts) > 1:
            raise ValueError(f"`thinking_options`: the options' values per row, `thinking_options`' and the "
                             f"generators must have one per row, the same number of rows; got {sorted(counts)}.")
        if not counts:  # every row alike: one unit
            pair = (make(config, generator), make(thinking_config(prepare, {}, scalars), generator))
            return cls([_Unit(None, pair)], start, end)
        rows = counts.pop()
        units: dict[tuple, _Unit] = {}
        for row in range(rows):
            base = {name: values[row] for name, values in (per_row.values if per_row is not None else {}).items()}
            base.update({name: values[row] for name, values in carried.items()})
            inside = {name: values[row] for name, values in
                      (inside_rows.values if inside_rows is not None else {}).items()}
            own = generator[row] if isinstance(generator, (list, tuple)) else generator
            key = (row if isinstance(generator, (list, tuple)) else None, tuple(sorted(base.items())),
                   tuple(sorted(inside.items())))
            unit = units.get(key)
            if unit is None:
                answering = prepare(dict(base)) if base else config
                inside_config = thinking_config(prepare, base, {**scalars, **inside}, row if inside else None)
                units[key] = _Unit([row], (make(answering, own), make(inside_config, own)))
            else:
                assert unit.rows is not None
                unit.rows.append(row)
        return cls(list(units.values()), start, end)

    def samplers(self) -> list[Any]:
        """Every sampler of every unit, answering then thinking."""
        return [sampler for unit in self.units for sampler in unit.samplers]

    def inside(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`(rows,)` bool on the device: the rows that are thinking (see the module)."""
        tags = self._tags.get(input_ids.device)
        if tags is None:
            tags = (torch.tensor(self.start, device=input_ids.device), torch.tensor(self.end, device=input_ids.device))
            self._tags[input_ids.device] = tags
        return span_open(input_ids, *tags)

    def parts(self, input_ids: torch.Tensor) -> list[tuple[Any, list[int] | None, int]]:
        """`(sampler, its rows (None: every row), phase)` for this step, in the order they run: one host read."""
        rows = input_ids.shape[0]
        self._check_count(rows)
        flags = [bool(flag) for flag in self.inside(input_ids).tolist()]  # the step's one added host read
        self.last = flags
        found: list[tuple[Any, list[int] | None, int]] = []
        for unit in self.units:
            members = unit.rows if unit.rows is not None else list(range(rows))
            for phase in (0, 1):
                picked = [row for row in members if flags[row] == bool(phase)]
                if picked:
                    whole = unit.rows is None and len(picked) == rows
                    found.append((unit.samplers[phase], None if whole else picked, phase))
        return found

    def _check_count(self, rows: int) -> None:
        expected = sum(len(unit.rows) for unit in self.units if unit.rows is not None)
        if expected and rows != expected:
            raise ValueError(f"`thinking_options`: the phases were built for {expected} rows (values or generators "
                             f"per row), but the step has {rows} rows.")

    # ---- the step, run part by part (the tokens, and the scores and flags where each part has them) ----

    def next_tokens(self, input_ids: torch.Tensor, rows: torch.Tensor, check: bool | None) -> torch.Tensor:
        """`(rows,)` each row's token from its phase's sampler (`Sampler.next_tokens` on its rows)."""
        tokens: torch.Tensor | None = None
        invalid: torch.Tensor | None = None
        for sampler, picked, _ in self.parts(input_ids):
            if picked is None:
                sampler.row_numbers = None
                tokens, flag = sampler.next_tokens(input_ids, rows, check=check), _flag(sampler)
                invalid = flag
                continue
            index = torch.tensor(picked, dtype=torch.long, device=rows.device)
            sampler.row_numbers = (rows.shape[0], index)
            part = sampler.next_tokens(input_ids.index_select(0, index), rows.index_select(0, index), check=check)
            tokens = _merged(tokens, index, part, rows.shape[0])
            flag = _flag(sampler)
            if flag is not None:
                invalid = _merged(invalid, index, flag.to(rows.device), rows.shape[0], fill=False)
        assert tokens is not None  # every row is in one part
        self.invalid = invalid
        return tokens

    def step(self, input_ids: torch.Tensor, rows: torch.Tensor, traces: dict[int, list] | None = None) -> StepResult:
        """`Sampler.step` for each part, merged: the tokens, the scores (None when a part keeps none: the
        fast path), the rows with nothing to choose, and an `explain` that raises the first part's error.
        `traces`: filled with each row's `[(processor, (vocab,) scores after it)]`, recorded by its phase's step."""
        if self.without_read:
            return self._step_on_device(input_ids, rows, traces)
        tokens: torch.Tensor | None = None
        scores: torch.Tensor | None = None
        invalid: torch.Tensor | None = None
        explains: list[tuple[torch.Tensor, Callable[[], None]]] = []
        kept = True
        results = []
        for sampler, picked, _ in self.parts(input_ids):
            trace: list | None = None if traces is None else []
            if picked is None:
                sampler.row_numbers = None
                result = sampler.step(input_ids, rows, route=sampler.route(keep_raw=True),  # scores kept: no argmax
                                      record=trace)
                index = None
            else:
                index = torch.tensor(picked, dtype=torch.long, device=rows.device)
                sampler.row_numbers = (rows.shape[0], index)
                result = sampler.step(input_ids.index_select(0, index), rows.index_select(0, index),
                                      route=sampler.route(keep_raw=True), record=trace)
            if traces is not None and trace is not None:
                _traced(traces, trace, list(range(rows.shape[0])) if picked is None else picked)
            results.append((index, result))
        count = rows.shape[0]
        for index, result in results:
            if index is None:
                return result
            tokens = _merged(tokens, index, result.tokens, count)
            kept = kept and result.scores is not None
            if kept:
                scores = _merged(scores, index, result.scores, count, fill=float("-inf"))
            if result.invalid is not None:
                flags = invalid_flags(result.invalid)  # [n] bool
                invalid = _merged(invalid, index, flags, count, fill=False)
                if result.explain is not None:
                    explains.append((flags, result.explain))
        assert tokens is not None

        def explain() -> None:
            for flags, raise_error in explains:
                if bool(flags.any()):
                    raise_error()

        return StepResult(tokens, scores if kept else None, invalid, explain if invalid is not None else None)

    def _step_on_device(self, input_ids: torch.Tensor, rows: torch.Tensor, traces: dict[int, list] | None = None
                        ) -> StepResult:
        """Both (greedy) phases on each unit's rows, each row's token, scores and validity taken from its phase's
        with `torch.where`: no host read (`without_read`)."""
        self._check_count(rows.shape[0])
        inside = self.inside(input_ids)  # [N] bool, on the device
        self.last = None
        count = rows.shape[0]
        tokens: torch.Tensor | None = None
        scores: torch.Tensor | None = None
        invalid: torch.Tensor | None = None
        explains: list[tuple[torch.Tensor, Callable[[], None]]] = []
        for unit in self.units:
            index = None if unit.rows is None else self._index(unit.rows, rows.device)
            ids, part = (input_ids, rows) if index is None else (input_ids.index_select(0, index),
                                                                 rows.index_select(0, index))
            flag = inside if index is None else inside.index_select(0, index)  # [n]
            for sampler in unit.samplers:
                sampler.row_numbers = None if index is None else (count, index)
            # each its own float32 copy, kept: both phases' processed scores, even where one has nothing to process
            recorded: tuple[list, list] = ([], [])
            answering, thinking = (sampler.step(ids, part, scores=part.to(torch.float32, copy=True),
                                                record=None if traces is None else recorded[phase])
                                   for phase, sampler in enumerate(unit.samplers))
            if traces is not None:  # each row's own phase's record (a host read: explaining only)
                members = list(range(count)) if unit.rows is None else unit.rows
                for local, (row, inside_row) in enumerate(zip(members, flag.tolist())):
                    traces[row] = [(processor, scores[local]) for processor, scores in recorded[int(inside_row)]]
            assert answering.scores is not None and thinking.scores is not None  # greedy: exact, scores kept
            chosen = torch.where(flag, thinking.tokens, answering.tokens)
            kept = torch.where(flag[:, None], thinking.scores, answering.scores)
            answering_bad, thinking_bad = (invalid_flags(result.invalid) if result.invalid is not None
                                           else torch.zeros_like(flag) for result in (answering, thinking))
            bad = torch.where(flag, thinking_bad, answering_bad)
            explains += [(answering_bad & ~flag, answering.explain), (thinking_bad & flag, thinking.explain)]
            if index is None:
                tokens, scores, invalid = chosen, kept, bad
            else:
                tokens = _merged(tokens, index, chosen, count)
                scores = _merged(scores, index, kept, count, fill=float("-inf"))
                invalid = _merged(invalid, index, bad, count, fill=False)
        assert tokens is not None

        def explain() -> None:
            for flags, raise_error in explains:
                if bool(flags.any()):
                    raise_error()

        return StepResult(tokens, scores, invalid, explain)

    def _index(self, members: list[int], device: torch.device) -> torch.Tensor:
        key = (members[0], device)
        index = self._indices.get(key)
        if index is None:
            index = self._indices[key] = torch.tensor(members, dtype=torch.long, device=device)
        return index

    def check_rows(self, invalid: bool | None = None) -> None:
        """Every phase sampler's `check_rows` (the fast path's flags read, exact mode's error raised)."""
        for sampler in self.samplers():
            sampler.check_rows(None if invalid is None or invalid else False)

    def explain(self, input_ids: torch.Tensor, rows: torch.Tensor
                ) -> tuple[dict[int, list[tuple[Any, torch.Tensor]]], torch.Tensor, list[bool], dict[int, bool]]:
        """`step` recorded: `(each row's [(processor, (vocab,) scores after it)], (rows,) tokens, each row's phase,
        each row's do_sample)`, the errors of rows left with nothing to choose raised at once."""
        traces: dict[int, list[tuple[Any, torch.Tensor]]] = {}
        result = self.step(input_ids, rows, traces)
        if result.invalid is not None and result.explain is not None and bool(invalid_flags(result.invalid).any()):
            result.explain()
        for sampler in self.samplers():  # the fast samplers' flags, read: the step's errors raised, let go
            sampler.check_rows()
        phases = self.last if self.last is not None else [bool(flag) for flag in self.inside(input_ids).tolist()]
        samples = {}
        for unit in self.units:
            for row in (range(rows.shape[0]) if unit.rows is None else unit.rows):
                samples[row] = bool(unit.samplers[int(phases[row])].do_sample)
        return traces, result.tokens, phases, samples


def _traced(traces: dict[int, list], trace: list, members: list[int]) -> None:
    """A part's record, `[(processor, (n, vocab) scores)]` for its rows `members`, as each row's own."""
    for local, row in enumerate(members):
        traces[row] = [(processor, scores[local]) for processor, scores in trace]


def _flag(sampler: Any) -> torch.Tensor | None:
    """The fast path's flags of the rows it could not sample (exact mode raised already)."""
    return sampler.invalid_rows if sampler.route() is Route.FAST else None


def _merged(into: torch.Tensor | None, index: torch.Tensor, part: torch.Tensor, rows: int,
            fill: Any = 0) -> torch.Tensor:
    """`part` `(n, ...)` written at the rows `index` of `into` `(rows, ...)` (made, filled with `fill`, if None)."""
    if into is None:
        into = torch.full((rows, *part.shape[1:]), fill, dtype=part.dtype, device=part.device)
    return into.index_copy_(0, index.to(part.device), part)


def phases_of(sampler: Any, config: GenerationConfig, per_row: PerRowValues | None, thinking: dict[str, Any],
              prepare: Callable[[dict[str, Any]], GenerationConfig]) -> Phases:
    """The phases of a `Sampler` built with `thinking_options` (its `do_sample` set to whether any phase samples);
    the options a phase cannot take refused."""
    for name, value in (("processors", sampler._user_processors), ("unconditional", sampler._unconditional),
                        ("prefix_allowed_tokens_fn", sampler._prefix_allowed_tokens_fn)):
        if value:
            raise ValueError(f"`thinking_options` with `{name}=` is not supported: each phase runs its own rows "
                             f"apart, which `{name}` does not expect; drop one of them.")

    def make(phase_config: GenerationConfig, generator: Any) -> Any:
        return type(sampler).from_prepared(phase_config, generator=generator, prompt_length=sampler.prompt_length,
                                           fast=sampler.fast, tokenizer=sampler._tokenizer, vocab_from_tokenizer=False)

    phases = Phases.build(config, per_row, thinking, sampler.generator, sampler._tokenizer, prepare, make)
    sampler.do_sample = any(part.do_sample for part in phases.samplers())
    return phases
