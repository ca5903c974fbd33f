"""The samplers of `hfbridge.processors` as generation options: built and placed from the option registry.

Their rows live in `_step/plan/option_table.py` (`ROWS`): each option's default (llama.cpp's `common/common.h`), its
check (errors name the option), the processor it configures and its place. The options travel on
the prepared `GenerationConfig` as extra attributes (HF keeps unknown attributes), so a
`GenerationConfig(dry_multiplier=0.8)` works like the keyword. `add_processors` builds the
processors and puts them in the chain order, by each row's `place`:

1. "penalties": `PresenceFrequencyPenaltyLogitsProcessor`, then `DRYLogitsProcessor`, right after HF's
   repetition penalty; with `penalty_last_n` the presence/frequency processor also takes over
   `repetition_penalty`, so both look at the same window (llama.cpp's `repeat_last_n`);
2. "temperature": `DynamicTemperatureLogitsWarper` in place of `TemperatureLogitsWarper` (`dynatemp_range > 0`);
   "after_temperature": `SmoothingLogitsWarper` and `TopNSigmaLogitsWarper` right after the temperature;
3. "after_truncation": `XTCLogitsWarper` after HF's truncation warpers (top-k, top-p, min-p, typical, epsilon,
   eta, top-h);
4. "last": `MirostatLogitsWarper` (`mirostat=2`) or `MirostatV1LogitsWarper` (`mirostat=1`) last (before
   HF's watermarks and `LogitNormalization`, if any), or `AdaptivePLogitsWarper` (`adaptive_target >= 0`): one
   of them, as each chooses the final token itself (their trait `picks_token`);
5. "first": `ThinkingBudgetLogitsProcessor` (`thinking_budget`) first (after HF's guidance, if any), as
   llama.cpp adds its reasoning budget first: the token it forces stays the only one left;
6. `sampler_order` (llama.cpp's `--samplers`), last: the named samplers trade places
   (`_step/plan/sampler_order.py`).

The warpers (2-4) apply when sampling, as HF's; passing one of their options turns sampling on, except an option
that only tunes a processor no option switches on (`xtc_threshold` without `xtc_probability`): that one does
nothing, and a `UserWarning` says so (`option_checks.warn_without_effect`).

>>> sorted(OPTIONS)[:3]
['adaptive_decay', 'adaptive_target', 'dry_allowed_length']
>>> check_community({"dry_base": 0.5})
Traceback (most recent call last):
...
ValueError: `dry_base` must be >= 1.0, got 0.5.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList

from hfbridge._step.checks.option_checks import check_option_values
from hfbridge._step.plan import sampler_order
from hfbridge._step.plan.hf_option_rows import chain_processors
from hfbridge._step.plan.option_table import ROWS, OptionRow, community_rows, order_members
from hfbridge.processors._traits import own_trait

__all__ = ["OPTIONS", "add_processors", "carry_options", "check_community", "split_options", "warper_options"]

# The rows of hfbridge.processors' options: a live view of the registry.
OPTIONS = community_rows()


def warper_options() -> tuple[str, ...]:
    """The options of our warpers: passing one means sampling, as HF's `temperature` or `top_p` does."""
    return tuple(name for name, row in OPTIONS.items() if row.sampling)


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(community options, the others)`.

    >>> split_options({"top_k": 5, "dry_multiplier": 0.8})
    ({'dry_multiplier': 0.8}, {'top_k': 5})
    """
    ours = {name: value for name, value in options.items() if name in OPTIONS}
    return ours, {name: value for name, value in options.items() if name not in OPTIONS}


def check_community(options: Mapping[str, Any], *, where: str = "") -> None:
    """Check every community option in `options` (None = not set); errors name the option."""
    check_option_values({name: value for name, value in options.items() if name in OPTIONS}, where=where)


def carry_options(config: GenerationConfig, options: Mapping[str, Any]) -> None:
    """Set the options (checked: `build_processors.make_generation_config`) on `config`, the extra attributes HF
    keeps."""
    for name, value in options.items():
        if value is not None:
            setattr(config, name, value)


def values(config: GenerationConfig) -> dict[str, Any]:
    """Every option's value on `config`, defaults filled in."""
    result = {}
    for name, row in OPTIONS.items():
        value = getattr(config, name, None)
        result[name] = row.default if value is None else value
    return result


def _named(processor: Any, rows: list[OptionRow]) -> Any:
    for row in rows:  # per-row length errors at a step name the option
        param = getattr(processor, row.argument or "", None)
        if param is not None and hasattr(param, "name"):
            param.name = row.name
    return processor


def _classes() -> dict[type, list[OptionRow]]:
    """Each of our processor classes and its rows (its own, and those that also configure it), in the registry's
    order."""
    classes: dict[type, list[OptionRow]] = {}
    for row in OPTIONS.values():
        if row.processor is not None:
            classes.setdefault(row.processor, []).append(row)
    by_name = {kind.__name__: kind for kind in classes}
    for row in OPTIONS.values():
        for name in row.also_configures:
            if name in by_name and row not in classes[by_name[name]]:
                classes[by_name[name]].insert(0, row)
    return classes


def build(config: GenerationConfig, *, tokenizer: Any = None, generator: Any = None,
          prompt_length: int | None = None) -> dict[type, Any]:
    """The processors the options on `config` ask for, by class (in the registry's order)."""
    v = values(config)
    built: dict[type, Any] = {}
    for kind, rows in _classes().items():
        switches = [row for row in rows if row.switch]
        on = any(row.active(v[row.name]) for row in switches)
        if kind.__name__ == "PresenceFrequencyPenaltyLogitsProcessor":
            on = on or _windowed(config, v)
        elif kind.__name__ == "MirostatLogitsWarper":
            on = v["mirostat"] == 2
        elif kind.__name__ == "MirostatV1LogitsWarper":
            on = v["mirostat"] == 1
        if not on or (any(row.sampling for row in rows) and not config.do_sample):
            continue
        arguments = {row.argument: v[row.name] for row in rows if row.argument}
        needs = {need for row in rows for need in row.needs}
        if "tokenizer" in needs:
            arguments["tokenizer"] = tokenizer
        if "prompt_length" in needs:
            arguments["prompt_length"] = prompt_length
        if "temperature" in needs:
            arguments["temperature"] = config.temperature if config.temperature is not None else 1.0
        if "generator" in needs:
            if generator is not None and not isinstance(generator, torch.Generator):
                name = next(row.name for row in switches)
                short = kind.__name__.removesuffix("LogitsWarper").removesuffix("LogitsProcessor")
                raise ValueError(
                    f"`{name}` draws one coin per row from one `generator`; a list of per-row generators "
                    f"is not supported with {short} yet: pass one torch.Generator (or none, for the global "
                    "RNG)."
                )
            arguments["generator"] = generator
        if kind.__name__ == "PresenceFrequencyPenaltyLogitsProcessor":
            _penalty_arguments(config, v, arguments, prompt_length)
        if kind.__name__ == "ThinkingBudgetLogitsProcessor":
            built[kind] = _named(_thinking_budget(kind, arguments, tokenizer, rows), rows)
            continue
        built[kind] = _named(kind(**arguments), rows)
    _check_pickers(built, config)
    return built


def _check_pickers(built: Mapping[type, Any], config: GenerationConfig) -> None:
    """The classes' traits (`processors/_traits.py`): one sampler that picks the final token, and none that replaces
    llama.cpp's chain with `sampler_order`; errors name each one's switch."""
    pickers = [kind for kind in built if own_trait(kind, "picks_token")]
    replacing = [kind for kind in built if own_trait(kind, "replaces_chain")]
    if len(pickers) < 2 and (not replacing or getattr(config, "sampler_order", None) is None):
        return
    classes = _classes()
    switch = {kind: next((row.name for row in classes[kind] if row.switch), classes[kind][0].name)
              for kind in (*pickers, *replacing)}
    if len(pickers) > 1:
        raise ValueError(f"`{switch[pickers[0]]}` and `{switch[pickers[1]]}` both choose the final token from a "
                         "distribution of their own (llama.cpp runs one or the other): pass one of them.")
    raise ValueError(f"`sampler_order` orders llama.cpp's sampler chain, which `{switch[replacing[0]]}` replaces "
                     "(llama.cpp ignores the order then): pass one of them.")


def _thinking_budget(kind: type, arguments: dict[str, Any], tokenizer: Any, rows: list[OptionRow]) -> Any:
    try:
        return kind(**arguments)
    except (TypeError, ValueError) as error:
        text = str(error)
        for row in rows:  # the constructor's argument names -> the options (`budget` -> `thinking_budget`)
            text = text.replace(f"`{row.argument}", f"`{row.name}")
        if tokenizer is None and "tokenizer=" in text:
            text = text.rstrip(".") + " (the default tags are the strings '<think>' and '</think>')."
        raise type(error)(text) from None


def _windowed(config: GenerationConfig, v: Mapping[str, Any]) -> bool:
    repetition = getattr(config, "repetition_penalty", None)
    return v["penalty_last_n"] is not None and repetition not in (None, 1.0)


def _penalty_arguments(config: GenerationConfig, v: Mapping[str, Any], arguments: dict[str, Any],
                       prompt_length: int | None) -> None:
    if v["penalty_last_n"] is None and prompt_length is None:
        raise ValueError(
            "`presence_penalty` and `frequency_penalty` count the generated tokens, so they need "
            "`prompt_length=` (the prompt's length in tokens; generate() knows it); or pass `penalty_last_n=` "
            "to count the last n tokens of input_ids, prompt included (-1 = all of them, llama.cpp's meaning)."
        )
    arguments["repetition_penalty"] = config.repetition_penalty if _windowed(config, v) else 1.0


# HF's processors that hfbridge's penalties follow, and those its last samplers precede: the registry's rows say
_BEFORE_PENALTIES = chain_processors("head")
# HF's warpers, from the registry's HF rows: the temperature, then the truncation warpers (top-k, top-p, ...).
_WARPERS = tuple(row.processor for row in ROWS.values() if row.sampling and not row.community)
_TRUNCATION = tuple(name for name in _WARPERS if name != "TemperatureLogitsWarper")
_TAIL = chain_processors("tail")


def add_processors(processors: LogitsProcessorList, config: GenerationConfig, *, tokenizer: Any = None,
                   generator: Any = None, prompt_length: int | None = None) -> LogitsProcessorList:
    """`processors` (HF's list, in HF's order) with the community processors in their places (in place)."""
    built = build(config, tokenizer=tokenizer, generator=generator, prompt_length=prompt_length)
    order = getattr(config, "sampler_order", None)
    if not built:
        if order is not None:
            processors[:] = sampler_order.apply_order(list(processors), order, order_members())
        return processors
    for processor in processors:
        if type(processor) in built:
            raise ValueError(
                f"`processors=` holds a {type(processor).__name__} and the options ask for one too; pass one of them.")
    items = list(processors)
    place = {kind: rows[0].place for kind, rows in _classes().items()}
    by_place: dict[str, list[Any]] = {}
    for kind, processor in built.items():
        by_place.setdefault(place[kind], []).append(processor)

    def names() -> list[str]:
        return [type(p).__name__ for p in items]

    penalties = by_place.get("penalties", [])
    if penalties:
        if any(getattr(p, "repetition_penalty", None) is not None and p.repetition_penalty.any(lambda x: x != 1.0)
               for p in penalties):
            items = [p for p in items if type(p).__name__ != "RepetitionPenaltyLogitsProcessor"]
        anchor = [i for i, n in enumerate(names()) if n in _BEFORE_PENALTIES]
        at = anchor[-1] + 1 if anchor else 0
        items[at:at] = penalties

    def tail() -> int:
        return next((i for i, n in enumerate(names()) if n in _TAIL), len(items))

    warpers = [i for i, n in enumerate(names()) if n in _WARPERS]
    temperature = next((i for i, n in enumerate(names()) if n == "TemperatureLogitsWarper"), None)
    for replacement in by_place.get("temperature", []):
        if temperature is not None:
            items[temperature] = replacement
        else:
            temperature = warpers[0] if warpers else tail()
            items.insert(temperature, replacement)
    at = temperature + 1 if temperature is not None else (warpers[0] if warpers else tail())
    after_temperature = by_place.get("after_temperature", [])
    items[at:at] = after_temperature
    truncation = [i for i, n in enumerate(names()) if n in _TRUNCATION]
    where = truncation[-1] + 1 if truncation else at + len(after_temperature)
    items[where:where] = by_place.get("after_truncation", [])
    end = tail()
    items[end:end] = by_place.get("last", [])
    guidance = [i for i, n in enumerate(names()) if n == "UnbatchedClassifierFreeGuidanceLogitsProcessor"]
    first = guidance[-1] + 1 if guidance else 0  # first, as llama.cpp's reasoning budget: what it forces stays
    items[first:first] = by_place.get("first", [])
    if order is not None:
        items = sampler_order.apply_order(items, order, order_members())
    processors[:] = items
    return processors
