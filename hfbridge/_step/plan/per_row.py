"""One value per row: the registry's per-row options (HF's numeric options and the community samplers')
given as a list, a tuple, a 1-D tensor or a NumPy array of length B.

Each row's scores are, bit for bit, those of the processors (HF's, and `hfbridge.processors`') built
with that row's scalar values and applied to that row alone. How:

1. `split_per_row` takes the per-row options out of the keyword arguments (checking each value,
   naming the option and the row) and leaves a representative value in their place, one that
   makes HF build the option's processor, so that HF's own list (`template`) holds every class
   some row needs, in HF's order.
2. `PerRowValues.plan` groups the rows by their combination of values (a temperature of 0 makes a
   row greedy: the list without any sampling warper, HF's or ours, then the argmax) and builds the
   list for each group's scalars (`RowPlan.build`); a processor that keeps state per row (mirostat)
   is its own instance in each group.
3. Where a group's list differs from the template (the per-row options' classes, and the sampling
   warpers a greedy row lacks), the template's processor is replaced by a `PerRowProcessor`,
   which runs each group's own HF instance on that group's rows (or leaves them as they are when
   the group has no such processor). A temperature is the same float32 arithmetic for every row,
   so it runs once for the whole batch with `(rows, 1)` divisors (`PerRowTemperature`: on CPU the
   division by a float32 tensor equals HF's division by the Python scalar bit for bit; on CUDA
   torch divides by a scalar as a multiplication by its float32 reciprocal, and so does this).
   Everything else (your own processors, options given as scalars) runs once on the whole batch.
4. `fast=True` draws once per group, with the group's own HF list (`RowPlan.fast_groups`); on CPU
   and CUDA groups that differ only in temperature and top-p share one draw, the temperature a `(n, 1)` tensor
   and the top-p a `(n, 1)` tensor every top-p route of the fast path takes (`tensor_top_p`).

The loop over groups runs once per distinct combination of values, never once per row of equal values.

>>> import torch
>>> scalars, values = split_per_row({"top_k": [1, 2], "temperature": 0.5})
>>> scalars, values.rows, values.values
({'top_k': 1, 'temperature': 0.5}, 2, {'top_k': (1, 2)})
>>> split_per_row({"top_p": [0.9, float("nan")]})
Traceback (most recent call last):
...
ValueError: `top_p[1]` (row 1) must be a finite number, got nan.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import GenerationConfig

from hfbridge._step.plan.build_processors import _check_values as check_values
from hfbridge._step.plan.option_table import ROWS, per_row_options, plain_options, sampling_options, sampling_processors
from hfbridge.processors._rows import RowParam, rows_mismatch
from hfbridge.processors._stateful import is_stateful

__all__ = ["PerRowProcessor", "PerRowTemperature", "PerRowValues", "RowPlan", "split_per_row", "tensor_top_p"]

_DEFAULTS = GenerationConfig()


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple)) or (isinstance(value, torch.Tensor) and value.ndim > 0)


def split_per_row(options: Mapping[str, Any]) -> tuple[dict[str, Any], PerRowValues | None]:
    """`(scalar options, PerRowValues or None)`: the per-row options checked and taken out.

    Every option of the registry that takes one value per row (`option_table.per_row_options`), HF's
    and `hfbridge.processors`' alike, may be a list, a tuple, a 1-D tensor or a NumPy array. A per-row
    option keeps a representative value among the scalars (one that builds its processor when some
    row needs it). A 0-d tensor or a NumPy scalar is read as a scalar. Raises `TypeError` /
    `ValueError` naming the option and the row for a non-number, NaN, inf, a bool, an empty list or a
    tensor of more than one axis.
    """
    scalars = plain_options(options)  # NumPy values are numbers
    values: dict[str, tuple] = {}
    per_row = per_row_options()
    for name, value in list(scalars.items()):
        if name not in per_row or value is None:
            continue
        if isinstance(value, torch.Tensor) and value.ndim == 0:
            scalars[name] = value.item()  # read once, when the options are set
            continue
        if not _is_sequence(value):
            continue
        values[name] = _checked_values(name, value)
    if not values:
        return scalars, None
    rows = {len(row_values) for row_values in values.values()}
    if len(rows) > 1:
        lengths = ", ".join(f"`{name}` {len(row_values)}" for name, row_values in values.items())
        raise ValueError(f"per-row options must all have one value per row, the same number of rows; got {lengths}.")
    for name, row_values in values.items():
        representative = _representative(name, row_values)
        # every row off (or greedy): the value that builds nothing, still an option passed (sampling is on)
        scalars[name] = ROWS[name].off if representative is None else representative
    return scalars, PerRowValues(rows.pop(), values)


def _checked_values(name: str, value: Any) -> tuple:
    """The one parser of "one value per row" (`hfbridge.processors`' `RowParam`), with the row's own checks."""
    row = ROWS[name]
    row.check_value(value)  # the option's own check, naming the option and the row
    return RowParam(name, value, integer=row.integer).values


def _representative(name: str, row_values: Sequence) -> Any:
    """A row's value that builds the option's processor, or None when no row needs one."""
    off = ROWS[name].off
    for value in row_values:
        if value != off and not (name == "temperature" and value == 0):
            return value
    return None


@dataclass
class PerRowValues:
    """The per-row options of one call: `values[name]` holds one value per row, `rows` of them."""

    rows: int
    values: dict[str, tuple]

    def expanded(self, times: int) -> PerRowValues:
        """Each row repeated `times` times in place, as `input_ids` for `num_return_sequences`."""
        return PerRowValues(self.rows * times, {name: tuple(v for v in row_values for _ in range(times))
                                                for name, row_values in self.values.items()})

    def check_rows(self, rows: int, *, what: str = "the step has") -> None:
        """`ValueError` unless there is one value per row."""
        if rows != self.rows:
            raise rows_mismatch(next(iter(self.values)), self.rows, rows, what)

    def plan(self, config: GenerationConfig) -> RowPlan:
        """Group the rows for `config` (prepared from the scalars of `split_per_row`)."""
        names = list(self.values)
        keys = []
        for row in range(self.rows):
            key = tuple(self.values[name][row] for name in names)
            sample = bool(config.do_sample) and self.values.get("temperature", (1.0,) * self.rows)[row] != 0
            keys.append((key, sample))
        groups: dict[tuple, list[int]] = {}
        for row, key in enumerate(keys):
            groups.setdefault(key, []).append(row)
        configs = []
        for (key, sample), rows in groups.items():
            group = copy.deepcopy(config)
            for name, value in zip(names, key):
                if name == "temperature" and value == 0:
                    continue  # greedy: HF's default temperature, never read
                setattr(group, name, value)
            group.do_sample = sample
            if not sample:  # a greedy row: the defaults of the warpers it never builds (and no warning)
                for name in sampling_options():
                    if hasattr(group, name):
                        setattr(group, name, getattr(_DEFAULTS, name, None))
            _check_group(group, rows)
            configs.append((group, rows))
        if config.do_sample and not any(sample for _, sample in groups):
            config.do_sample = False  # every row greedy
        return RowPlan(self.rows, configs, [sample for _, sample in keys], names, [key for key, _ in groups])


def _check_group(config: GenerationConfig, rows: list[int]) -> None:
    """HF's own range checks on a group's values, naming the first row that holds them."""
    try:
        check_values(config)
    except ValueError as error:
        more = f" and {len(rows) - 1} other rows" if len(rows) > 1 else ""
        raise ValueError(f"{str(error).rstrip('.')} (the value of row {rows[0]}{more}).") from None


@dataclass
class RowPlan:
    """Rows grouped by their values: each group's HF config and rows; which rows sample."""

    rows: int
    groups: list[tuple[GenerationConfig, list[int]]]
    samples: list[bool]
    names: list[str]
    group_keys: list[tuple] = field(default_factory=list)  # each group's values, in the order of `names`
    lists: list[list] = field(default_factory=list)  # each group's full processor list, after `build`
    # the template's places, after `build`: (kind, the shared processor or the temperatures, each group's part)
    positions: list[tuple[str, Any, list]] = field(default_factory=list)
    indices: list[torch.Tensor] = field(default_factory=list)  # each group's rows, on the device

    @property
    def mixed(self) -> bool:
        """Some rows greedy, some sampled."""
        return any(self.samples) and not all(self.samples)

    def build(self, template: list, build_list: Callable[[GenerationConfig], list], device: torch.device) -> list:
        """The template with a `PerRowProcessor` where a group's HF processor differs; the groups' own lists.

        `build_list(config)` is HF's processor list for one group's config.
        """
        self.indices = [torch.tensor(rows, dtype=torch.long, device=device) for _, rows in self.groups]
        own = [build_list(config) for config, _ in self.groups]
        varying = {kind for name in self.names for kind in ROWS[name].classes}
        if not all(self.samples):
            varying.update(sampling_processors())
        merged: list = []
        self.lists = [[] for _ in self.groups]
        self.positions = []
        for processor in template:
            kind = type(processor).__name__
            if kind not in varying and is_stateful(processor):  # one state per group: its own instance
                parts = [next((p for p in group_list if type(p) is type(processor)), None) for group_list in own]
                if not all(part is processor for part in parts):
                    varying.add(kind)
            if kind not in varying:
                merged.append(processor)
                self.positions.append(("shared", processor, []))
                for group_list in self.lists:
                    group_list.append(processor)
                continue
            parts = [next((p for p in group_list if type(p) is type(processor)), None) for group_list in own]
            for group_list, part in zip(self.lists, parts):
                if part is not None:
                    group_list.append(part)
            if kind == "TemperatureLogitsWarper" and device.type in _TEMPERATURE_DEVICES:
                divisors = self._temperatures(parts)  # [N, 1], kept on CPU (a fast group moves its rows')
                merged.append(PerRowTemperature(divisors, device))
                self.positions.append(("temperature", divisors, parts))
            else:
                merged.append(PerRowProcessor(kind, list(zip(parts, self.indices)), self.rows))
                self.positions.append(("parts", parts, parts))
        return merged

    def group_tail(self, number: int, start: int) -> list:
        """Group `number`'s own processors from the template's place `start` on (its whole chain's tail)."""
        processors = []
        for kind, held, parts in self.positions[start:]:
            if kind == "shared":
                processors.append(held)
            elif parts[number] is not None:
                processors.append(parts[number])
        return processors

    def fast_groups(self, device: torch.device, start: int = 0) -> list[tuple[list[int], torch.Tensor, list, bool]]:
        """`(rows, (n,) index, processors, samples)` per fast draw, the processors from the template's place
        `start` on: on CPU and CUDA, rows whose values differ only in temperature and top-p share one,
        with a `(n, 1)` temperature the fast path applies as HF's division does there (`FastState.divided`,
        `PerRowTemperature`) and a `(n, 1)` top-p every top-p route takes (`tensor_top_p`); on other
        devices, or when a processor keeps state per row, one per group, with its own HF list.
        """
        positions = self.positions[start:]
        stateful = any(is_stateful(part) for kind, _, parts in positions for part in parts
                       if kind != "shared" and part is not None)
        top_p_places = [place for place, (kind, held, _) in enumerate(positions)
                        if kind == "parts" and any(type(part).__name__ == "TopPLogitsWarper" for part in held)]
        temperatures = any(kind == "temperature" for kind, _, _ in positions)
        if device.type not in _TEMPERATURE_DEVICES or stateful or not (top_p_places or temperatures):
            return [(rows, index, self.group_tail(number, start), self.samples[rows[0]])
                    for number, ((_, rows), index) in enumerate(zip(self.groups, self.indices))]
        skip = {place for place, name in enumerate(self.names) if ROWS[name].shares_draw}  # temperature, top-p
        merged: dict[tuple, list[int]] = {}  # key without the temperature and top-p -> the groups it joins
        for number, (_, rows) in enumerate(self.groups):
            values = self.group_keys[number]
            # a row without HF's top-p warper (top_p 1.0) never joins one with it: the warper at 1.0 is not a no-op
            has_top_p = tuple(positions[place][1][number] is not None for place in top_p_places)
            key = (tuple(v for i, v in enumerate(values) if i not in skip), self.samples[rows[0]], has_top_p)
            merged.setdefault(key, []).append(number)
        result = []
        for joined in merged.values():
            rows = sorted(row for number in joined for row in self.groups[number][1])
            index = torch.tensor(rows, dtype=torch.long, device=device)
            first, samples = joined[0], self.samples[rows[0]]
            owner = {row: number for number in joined for row in self.groups[number][1]}  # row -> its group
            processors = []
            for place, (kind, held, _) in enumerate(positions):
                if kind == "shared":
                    processors.append(held)
                elif kind == "parts" and held[first] is not None:
                    processors.append(_joined_top_p([held[owner[row]] for row in rows], device)
                                      if place in top_p_places else held[first])
                elif kind == "temperature" and samples:
                    processors.append(tensor_temperature(held[rows].to(device)))  # `held` stays on CPU
            result.append((rows, index, processors, samples))
        return result

    def _temperatures(self, parts: list) -> torch.Tensor:
        divisors = torch.ones(self.rows, 1, dtype=torch.float32)  # [N, 1] on CPU; 1.0: a row without a temperature
        for part, (_, rows) in zip(parts, self.groups):
            if part is not None:
                divisors[rows] = float(part.temperature)
        return divisors


# Devices where `PerRowTemperature` gives HF's bits: CPU divides by the float32 value, CUDA multiplies
# by its float32 reciprocal (torch's division by a CPU scalar there); elsewhere HF's class runs per group.
_TEMPERATURE_DEVICES = ("cpu", "cuda")


def _joined_top_p(parts: list, device: torch.device) -> Any:
    """One HF top-p warper for rows drawn together (`parts`: each row's own): the first if they all hold
    the same top-p, else `tensor_top_p` of theirs (their other fields come from one config: equal)."""
    values = [float(part.top_p) for part in parts]
    if all(value == values[0] for value in values):
        return parts[0]
    return tensor_top_p(values, parts[0].min_tokens_to_keep, parts[0].filter_value, device)


def tensor_top_p(values: Sequence[float], min_tokens_to_keep: int = 1, filter_value: float = float("-inf"),
                 device: torch.device | str = "cpu") -> Any:
    """HF's `TopPLogitsWarper` holding `(rows, 1)` float64 top-p values, one per row, instead of a float:
    every top-p route of the fast path takes it (`_step/fast/top_p/route_table.py`), so that rows with
    distinct top-p values are one draw. Only the fast path reads it: HF's own `__call__` would compare
    its float32 running sums in float64.

    >>> warper = tensor_top_p([0.9, 0.5])
    >>> warper.top_p.tolist(), warper.min_tokens_to_keep
    ([[0.9], [0.5]], 1)
    """
    from transformers import TopPLogitsWarper

    warper = TopPLogitsWarper(max(values), filter_value=filter_value, min_tokens_to_keep=min_tokens_to_keep)
    warper.top_p = torch.tensor(values, dtype=torch.float64, device=device)[:, None]  # type: ignore[assignment]
    return warper


def tensor_temperature(divisors: torch.Tensor) -> Any:
    """HF's `TemperatureLogitsWarper` holding `(rows, 1)` float32 divisors instead of a float: the fast
    path reads `.temperature` and applies it as HF's division by a float does (`FastState.divided`: on CPU
    a division, on CUDA a multiplication by the float32 reciprocal).

    >>> tensor_temperature(torch.tensor([[2.0]]))(None, torch.ones(1, 2)).tolist()
    [[0.5, 0.5]]
    """
    from transformers import TemperatureLogitsWarper

    warper = TemperatureLogitsWarper.__new__(TemperatureLogitsWarper)  # HF's checks are for a float
    warper.temperature = divisors  # type: ignore[assignment]
    return warper


class PerRowTemperature:
    """`scores / temperature` with one temperature per row: `(rows, 1)` float32 divisors.

    HF's `TemperatureLogitsWarper` divides by a Python float, which torch rounds to float32 first;
    dividing by the same float32 value in a tensor gives the same bits, and a row divided by 1.0
    keeps its own bits (a greedy row, or a row at temperature 1, has no temperature in HF).

    >>> PerRowTemperature(torch.tensor([[2.0], [1.0]]))(None, torch.ones(2, 2)).tolist()
    [[0.5, 0.5], [1.0, 1.0]]
    """

    def __init__(self, divisors: torch.Tensor, device: torch.device | str = "cpu") -> None:
        divisors = divisors.to(dtype=torch.float32, device="cpu")  # [N, 1]
        self.divisors = divisors.to(device)
        # torch on CUDA divides by a CPU scalar as a * (1 / b), the reciprocal taken on the host in float32
        self.reciprocals = (1.0 / divisors).to(device)  # [N, 1]

    def __call__(self, input_ids: Any, scores: torch.Tensor) -> torch.Tensor:
        if scores.device.type == "cuda":
            return scores * self.reciprocals  # [N, V]
        return scores / self.divisors  # [N, V]

    def __repr__(self) -> str:
        return f"PerRowTemperature({self.divisors.flatten().tolist()})"


class PerRowProcessor:
    """HF's processor of one class, one instance per group of rows, each run on its group's rows only.

    Args:
        name: The HF class's name (for messages and the processor table).
        parts: `(processor or None, (n,) int64 row indices)` per group; None leaves those rows as they are.
        rows: The batch's number of rows.

    >>> from transformers import TopKLogitsWarper
    >>> per_row = PerRowProcessor("TopKLogitsWarper", [(TopKLogitsWarper(1), torch.tensor([0])),
    ...                                                 (None, torch.tensor([1]))], 2)
    >>> per_row(torch.zeros(2, 0, dtype=torch.long), torch.tensor([[1.0, 2.0], [1.0, 2.0]])).tolist()
    [[-inf, 2.0], [1.0, 2.0]]
    """

    def __init__(self, name: str, parts: list[tuple[Any, torch.Tensor]], rows: int) -> None:
        self.name = name
        self.parts = parts
        self.rows = rows

    def __call__(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor | None = None
        for processor, index in self.parts:
            if processor is None:
                continue
            ids = None if input_ids is None else input_ids.index_select(0, index)  # [n, T]
            part = processor(ids, scores.index_select(0, index))  # [n, V], that group's rows alone
            if out is None:
                out = scores.clone()  # never written in place: the caller may keep `scores` (raw logits)
            out.index_copy_(0, index, part)
        return scores if out is None else out

    def __repr__(self) -> str:
        return f"PerRow[{self.name}]({', '.join(repr(p) for p, _ in self.parts)})"

    @property
    def __name__(self) -> str:
        return f"PerRow[{self.name}]"

