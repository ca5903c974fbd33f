"""`thinking_options` checked, and what the phases need around it: the tags, each phase's config, the phases of a
finished sequence (`_step/run/phases.py` runs them).

>>> import torch
>>> phases = check_thinking_options({"temperature": 0.7, "top_k": 3})
>>> phases
{'temperature': 0.7, 'top_k': 3}
>>> check_thinking_options({"temprature": 0.7})
Traceback (most recent call last):
...
TypeError: `thinking_options` holds an unknown option `temprature`. Did you mean `temperature`?
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from transformers import GenerationConfig

from hfbridge._hf.stand_in import generation_option_names
from hfbridge._step.checks.option_checks import did_you_mean
from hfbridge._step.plan.build_processors import step_option_names
from hfbridge._step.plan.community_options import OPTIONS as COMMUNITY_OPTIONS
from hfbridge._step.plan.hf_option_rows import HF_OPTION_ROWS
from hfbridge._step.plan.option_table import phase_tags
from hfbridge._step.plan.per_row import PerRowValues, split_per_row
from hfbridge.processors.thinking_budget import tag_ids

__all__ = ["PHASE_NAMES", "check_thinking_options", "expand_thinking_options", "split_options", "thinking_config",
           "thinking_steps", "thinking_tag"]

PHASE_NAMES = ("answer", "thinking")  # a row's phase, by the value of `span_open`

# Options of the whole call, the same in both phases: the tags that find the phase (the registry's rows that say
# `phase_tag`), and the rows that say `whole_call` (the lengths, the special tokens, guidance's second sequence,
# watermarks).
_CALL_OPTIONS = frozenset(name for name, row in HF_OPTION_ROWS.items() if row.whole_call)


def check_thinking_options(value: Any) -> dict[str, Any] | None:
    """`thinking_options` checked by name (a mapping of step options); its values are checked when its
    samplers are built (`Phases.build`). None stays None."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError("`thinking_options` must be a mapping of the options that differ while a row is "
                        f"thinking (e.g. {{'temperature': 0.8}}), got {type(value).__name__}.")
    accepted = step_option_names() | frozenset(COMMUNITY_OPTIONS) | {"do_sample"}
    checked: dict[str, Any] = {}
    for name, option in value.items():
        if not isinstance(name, str):
            raise TypeError(f"`thinking_options` keys must be option names (str), got {type(name).__name__} "
                            f"{name!r}.")
        if name == "thinking_options":
            raise ValueError("`thinking_options` holds `thinking_options`: phases do not nest; pass the thinking "
                             "phase's options directly in it.")
        if name in phase_tags():
            raise ValueError(f"`thinking_options` holds `{name}`, which finds the phase and so is the same in both: "
                             "pass it beside `thinking_options`.")
        if name in _CALL_OPTIONS or (name in generation_option_names() and name not in accepted):
            raise ValueError(f"`thinking_options` holds `{name}`, an option of the whole call (the strategy, the "
                             "lengths, the special tokens), which cannot differ by phase: pass it beside "
                             "`thinking_options`.")
        if name not in accepted:
            raise TypeError(f"`thinking_options` holds an unknown option `{name}`."
                            f"{did_you_mean(name, accepted)}")
        checked[name] = option
    return checked


def expand_thinking_options(options: dict[str, Any] | None, prompts: int, expand: int) -> dict[str, Any] | None:
    """`thinking_options` with its values per prompt repeated for each of a prompt's `expand` rows, as
    `generate` expands `input_ids` (`num_return_sequences`)."""
    if options is None:
        return options
    _, values = split_options("thinking_options", options)
    if values is None:
        return options
    _check_rows(values, prompts, "`input_ids` has")
    return options if expand == 1 else {**options, **values.expanded(expand).values}


def thinking_steps(ids: list[int], start: Any, end: Any, first: int, tokenizer: Any = None) -> list[bool]:
    """For each token of `ids` from position `first` on: whether its row was thinking when it was chosen (the
    tokens before it hold a start tag not closed after it); `start` / `end` as `thinking_start` / `thinking_end`.

    >>> thinking_steps([1, 7, 3, 8, 9, 4], [7], [8, 9], first=2)
    [True, True, True, False]
    """
    start_ids, end_ids = thinking_tag("thinking_start", start, tokenizer), thinking_tag("thinking_end", end, tokenizer)
    flags = []
    opened = closed = 0  # where the last start tag and the last end tag end
    for position in range(len(ids)):
        if position >= first:
            flags.append(opened > closed)
        length = position + 1
        if ids[max(0, length - len(start_ids)):length] == start_ids:
            opened = length
        if ids[max(0, length - len(end_ids)):length] == end_ids:
            closed = length
    return flags


def thinking_config(prepare: Callable[[dict[str, Any]], GenerationConfig], base: dict[str, Any],
              inside: dict[str, Any], row: int | None = None) -> GenerationConfig:
    """The thinking phase's config: the call's options with the row's values `base`, updated with `inside`."""
    try:
        return prepare({**base, **inside})
    except (TypeError, ValueError) as error:
        where = f" (row {row})" if row is not None else ""
        raise type(error)(f"`thinking_options`{where}: {error}") from None


def thinking_tag(name: str, value: Any, tokenizer: Any) -> list[int]:
    if isinstance(value, str) and tokenizer is None:
        raise ValueError(f"`{name}` is a string ({value!r}): `thinking_options` finds the thinking phase by its "
                         "tags, so pass `tokenizer=` to tokenize them, or give `thinking_start` and `thinking_end` "
                         "as token ids (the default tags are the strings '<think>' and '</think>').")
    return tag_ids(name, value, tokenizer)


def _check_rows(values: PerRowValues, rows: int, what: str) -> None:
    try:
        values.check_rows(rows, what=what)
    except ValueError as error:
        raise ValueError(f"`thinking_options`: {error}") from None


def split_options(name: str, options: dict[str, Any]) -> tuple[dict[str, Any], PerRowValues | None]:
    try:
        return split_per_row(options)
    except (TypeError, ValueError) as error:
        raise type(error)(f"`{name}`: {error}") from None
