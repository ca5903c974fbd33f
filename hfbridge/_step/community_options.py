"""The samplers of `hfbridge.processors` as generation options: one row per option, and their place.

`OPTIONS` is the table: each option's default (llama.cpp's `common/common.h`), its check (errors name
the option) and the processor it configures. The options travel on the prepared `GenerationConfig`
as extra attributes (HF keeps unknown attributes), so a `GenerationConfig(dry_multiplier=0.8)`
works like the keyword. `add_processors` builds the processors and puts them in the chain order:

1. `PresenceFrequencyPenaltyLogitsProcessor`, then `DRYLogitsProcessor`, where HF puts its
   repetition penalty (right after it); with `penalty_last_n` the presence/frequency processor also
   takes over `repetition_penalty`, so both look at the same window (llama.cpp's `repeat_last_n`);
2. `DynamicTemperatureLogitsWarper` in place of `TemperatureLogitsWarper` (`dynatemp_range > 0`),
   then `SmoothingLogitsWarper` and `TopNSigmaLogitsWarper` right after the temperature;
3. `XTCLogitsWarper` after HF's truncation warpers (top-k, top-p, min-p, typical, epsilon, eta, top-h);
4. `MirostatLogitsWarper` (`mirostat=2`) or `MirostatV1LogitsWarper` (`mirostat=1`) last (before
   HF's watermarks and `LogitNormalization`, if any), or `AdaptivePLogitsWarper` (`adaptive_target >= 0`);
5. `ThinkingBudgetLogitsProcessor` (`thinking_budget`) first (after HF's guidance, if any), as
   llama.cpp adds its reasoning budget first: the token it forces stays the only one left;
6. `sampler_order` (llama.cpp's `--samplers`), last: the named samplers trade places
   (`_step/sampler_order.py`).

The warpers (2-4) apply when sampling, as HF's; passing one of their options turns sampling on.

>>> sorted(OPTIONS)[:3]
['adaptive_decay', 'adaptive_target', 'dry_allowed_length']
>>> check_community({"dry_base": 0.5})
Traceback (most recent call last):
...
ValueError: `dry_base` must be >= 1.0, got 0.5.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList

from hfbridge._step import sampler_order
from hfbridge.processors import (
    AdaptivePLogitsWarper,
    DRYLogitsProcessor,
    DynamicTemperatureLogitsWarper,
    MirostatLogitsWarper,
    MirostatV1LogitsWarper,
    PresenceFrequencyPenaltyLogitsProcessor,
    SmoothingLogitsWarper,
    ThinkingBudgetLogitsProcessor,
    TopNSigmaLogitsWarper,
    XTCLogitsWarper,
)
from hfbridge.processors._dry_breakers import compile_breakers
from hfbridge.processors._rows import RowParam, described
from hfbridge.processors.dry import DEFAULT_SEQUENCE_BREAKERS

__all__ = ["OPTIONS", "WARPER_OPTIONS", "add_processors", "carry_options", "check_community", "split_options"]


def _rows(**bounds: Any) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        RowParam(name, value, **bounds)
    return check


def _mirostat(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int (0 = off, 1 = mirostat 1.0, 2 = mirostat 2.0), "
                        f"got {described(value)}.")
    if value not in (0, 1, 2):
        raise ValueError(f"`{name}` must be 0 (off), 1 (mirostat 1.0) or 2 (mirostat 2.0), got {value!r}.")


def _tag(name: str, value: Any, *, empty: bool = False) -> None:
    # a string (tokenized with the tokenizer when the processor is built) or token ids
    if isinstance(value, str):
        if not value and not empty:
            raise ValueError(f"`{name}` is an empty string.")
        return
    if isinstance(value, torch.Tensor) and value.ndim == 1 and not value.is_floating_point() \
            and value.dtype != torch.bool:
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(token, int) and not isinstance(token, bool) and token >= 0 for token in value):
        raise TypeError(f"`{name}` must be a string or a sequence of token ids (ints >= 0), got {described(value)}.")
    if not value and not empty:
        raise ValueError(f"`{name}` is empty: give at least one token id.")


def _message(name: str, value: Any) -> None:
    _tag(name, value, empty=True)


def _breakers(name: str, value: Any) -> None:
    # token-id sequences are compiled here; strings only checked (the tokenizer comes with the processor)
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"`{name}` must be a list of strings or of token-id sequences, got {described(value)}.")
    for index, breaker in enumerate(value):
        if isinstance(breaker, str):
            if not breaker:
                raise ValueError(f"`{name}[{index}]` is an empty string.")
            continue
        try:
            compile_breakers([breaker], tokenizer=None)
        except (TypeError, ValueError):
            raise TypeError(f"`{name}[{index}]` must be a string or a non-empty sequence of token ids (ints >= 0), "
                            f"got {described(breaker)}.") from None


@dataclasses.dataclass(frozen=True)
class Option:
    """One row of the table: the option's default, its check and the processor it configures."""

    default: Any
    check: Callable[[str, Any], None]
    processor: type


OPTIONS: dict[str, Option] = {
    "presence_penalty": Option(0.0, _rows(), PresenceFrequencyPenaltyLogitsProcessor),
    "frequency_penalty": Option(0.0, _rows(), PresenceFrequencyPenaltyLogitsProcessor),
    "penalty_last_n": Option(None, _rows(integer=True, minimum=-1), PresenceFrequencyPenaltyLogitsProcessor),
    "dry_multiplier": Option(0.0, _rows(minimum=0.0), DRYLogitsProcessor),
    "dry_base": Option(1.75, _rows(minimum=1.0), DRYLogitsProcessor),
    "dry_allowed_length": Option(2, _rows(integer=True, minimum=1), DRYLogitsProcessor),
    "dry_penalty_last_n": Option(-1, _rows(integer=True, minimum=-1), DRYLogitsProcessor),
    "dry_sequence_breakers": Option(DEFAULT_SEQUENCE_BREAKERS, _breakers, DRYLogitsProcessor),
    "dynatemp_range": Option(0.0, _rows(minimum=0.0), DynamicTemperatureLogitsWarper),
    "dynatemp_exponent": Option(1.0, _rows(above=0.0), DynamicTemperatureLogitsWarper),
    "smoothing_factor": Option(0.0, _rows(minimum=0.0), SmoothingLogitsWarper),
    "smoothing_curve": Option(1.0, _rows(minimum=1.0), SmoothingLogitsWarper),
    "top_n_sigma": Option(None, _rows(above=0.0), TopNSigmaLogitsWarper),
    "xtc_threshold": Option(0.1, _rows(above=0.0, maximum=1.0), XTCLogitsWarper),
    "xtc_probability": Option(0.0, _rows(minimum=0.0, maximum=1.0), XTCLogitsWarper),
    "mirostat": Option(0, _mirostat, MirostatLogitsWarper),
    "mirostat_tau": Option(5.0, _rows(above=0.0), MirostatLogitsWarper),
    "mirostat_eta": Option(0.1, _rows(above=0.0), MirostatLogitsWarper),
    # -- mirostat 1.0 (`mirostat=1`, with `mirostat_tau` and `mirostat_eta` above) --
    "mirostat_m": Option(100, _rows(integer=True, minimum=1), MirostatV1LogitsWarper),
    # -- adaptive-p --
    "adaptive_target": Option(-1.0, _rows(maximum=1.0), AdaptivePLogitsWarper),
    "adaptive_decay": Option(0.9, _rows(minimum=0.0, maximum=0.99), AdaptivePLogitsWarper),
    # -- a thinking budget (greedy or sampling) --
    "thinking_budget": Option(None, _rows(integer=True, minimum=0), ThinkingBudgetLogitsProcessor),
    "thinking_start": Option("<think>", _tag, ThinkingBudgetLogitsProcessor),
    "thinking_end": Option("</think>", _tag, ThinkingBudgetLogitsProcessor),
    "thinking_budget_message": Option(None, _message, ThinkingBudgetLogitsProcessor),
    # -- the order of llama.cpp's samplers in the chain (`_step/sampler_order.py`; greedy or sampling) --
    "sampler_order": Option(None, sampler_order.check_order, type(None)),
}

# Options of the warpers: passing one means sampling, as HF's `temperature` or `top_p` does.
WARPER_OPTIONS = tuple(name for name, row in OPTIONS.items() if row.processor in (
    DynamicTemperatureLogitsWarper, SmoothingLogitsWarper, TopNSigmaLogitsWarper, XTCLogitsWarper,
    MirostatLogitsWarper, MirostatV1LogitsWarper, AdaptivePLogitsWarper))


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(community options, the others)`.

    >>> split_options({"top_k": 5, "dry_multiplier": 0.8})
    ({'dry_multiplier': 0.8}, {'top_k': 5})
    """
    ours = {name: value for name, value in options.items() if name in OPTIONS}
    return ours, {name: value for name, value in options.items() if name not in OPTIONS}


def check_community(options: Mapping[str, Any], *, where: str = "") -> None:
    """Check every community option in `options` (None = not set); errors name the option."""
    for name, value in options.items():
        if name in OPTIONS and value is not None:
            try:
                OPTIONS[name].check(name, value)
            except (TypeError, ValueError) as error:
                if not where:
                    raise
                raise type(error)(f"{str(error).rstrip('.')} ({where}).") from None


def carry_options(config: GenerationConfig, options: Mapping[str, Any], user_config: GenerationConfig | None) -> None:
    """Check the options (keywords and the user's config's extra attributes) and set them on `config`."""
    if user_config is not None:
        check_community({name: getattr(user_config, name, None) for name in OPTIONS}, where="in `generation_config`")
    check_community(options)
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


def _active(value: Any, off: Callable[[Any], bool]) -> bool:
    items = value.tolist() if isinstance(value, torch.Tensor) else value
    items = items if isinstance(items, (list, tuple)) else [items]
    return not all(off(v) for v in items)


def _named(processor: Any, names: Mapping[str, str]) -> Any:
    for attribute, option in names.items():  # per-row length errors at a step name the option
        getattr(processor, attribute).name = option
    return processor


def build(config: GenerationConfig, *, tokenizer: Any = None, generator: Any = None,
          prompt_length: int | None = None) -> dict[str, Any]:
    """The processors the options on `config` ask for, by kind."""
    v = values(config)
    built: dict[str, Any] = {}
    repetition = getattr(config, "repetition_penalty", None)
    windowed = v["penalty_last_n"] is not None and repetition not in (None, 1.0)
    if windowed or _active(v["presence_penalty"], lambda x: x == 0) or _active(v["frequency_penalty"],
                                                                                lambda x: x == 0):
        if v["penalty_last_n"] is None and prompt_length is None:
            raise ValueError(
                "`presence_penalty` and `frequency_penalty` count the generated tokens, so they need "
                "`prompt_length=` (the prompt's length in tokens; generate() knows it); or pass `penalty_last_n=` "
                "to count the last n tokens of input_ids, prompt included (-1 = all of them, llama.cpp's meaning)."
            )
        built["penalties"] = PresenceFrequencyPenaltyLogitsProcessor(
            v["presence_penalty"], v["frequency_penalty"], v["penalty_last_n"], prompt_length,
            repetition_penalty=repetition if windowed else 1.0)
    if _active(v["dry_multiplier"], lambda x: x == 0):
        try:
            dry = DRYLogitsProcessor(v["dry_multiplier"], v["dry_base"], v["dry_allowed_length"],
                                     v["dry_penalty_last_n"], v["dry_sequence_breakers"], tokenizer=tokenizer)
        except (TypeError, ValueError) as error:
            raise type(error)(str(error).replace("`sequence_breakers", "`dry_sequence_breakers")) from None
        built["dry"] = _named(dry, {"multiplier": "dry_multiplier", "base": "dry_base",
                                    "allowed_length": "dry_allowed_length", "penalty_last_n": "dry_penalty_last_n"})
    if v["thinking_budget"] is not None:
        built["thinking_budget"] = _thinking_budget(v, tokenizer, prompt_length)
    if not config.do_sample:
        return built
    if _active(v["dynatemp_range"], lambda x: x == 0):
        built["dynatemp"] = _named(DynamicTemperatureLogitsWarper(
            config.temperature if config.temperature is not None else 1.0, v["dynatemp_range"],
            v["dynatemp_exponent"]), {"range": "dynatemp_range", "exponent": "dynatemp_exponent"})
    if _active(v["smoothing_factor"], lambda x: x == 0):
        built["smoothing"] = _named(SmoothingLogitsWarper(v["smoothing_factor"], v["smoothing_curve"]),
                                    {"factor": "smoothing_factor", "curve": "smoothing_curve"})
    if v["top_n_sigma"] is not None:
        built["top_n_sigma"] = _named(TopNSigmaLogitsWarper(v["top_n_sigma"]), {"n": "top_n_sigma"})
    if _active(v["xtc_probability"], lambda x: x == 0):
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(
                "`xtc_probability` draws one coin per row from one `generator`; a list of per-row generators "
                "is not supported with XTC yet: pass one torch.Generator (or none, for the global RNG)."
            )
        built["xtc"] = _named(XTCLogitsWarper(v["xtc_threshold"], v["xtc_probability"], generator=generator),
                              {"threshold": "xtc_threshold", "probability": "xtc_probability"})
    if v["mirostat"] == 2:
        built["mirostat"] = _named(MirostatLogitsWarper(v["mirostat_tau"], v["mirostat_eta"]),
                                   {"tau": "mirostat_tau", "eta": "mirostat_eta"})
    if v["mirostat"] == 1:
        built["mirostat"] = _named(MirostatV1LogitsWarper(v["mirostat_tau"], v["mirostat_eta"], v["mirostat_m"]),
                                   {"tau": "mirostat_tau", "eta": "mirostat_eta", "m": "mirostat_m"})
    if _active(v["adaptive_target"], lambda x: x < 0):
        if "mirostat" in built:
            raise ValueError("`mirostat` and `adaptive_target` both choose the final token from a distribution of "
                             "their own (llama.cpp runs one or the other): pass one of them.")
        built["adaptive_p"] = _named(AdaptivePLogitsWarper(v["adaptive_target"], v["adaptive_decay"]),
                                     {"target": "adaptive_target", "decay": "adaptive_decay"})
    if v["sampler_order"] is not None and "mirostat" in built:
        raise ValueError("`sampler_order` orders llama.cpp's sampler chain, which `mirostat` replaces (llama.cpp "
                         "ignores the order then): pass one of them.")
    return built


_THINKING_NAMES = {"`budget": "`thinking_budget", "`start_ids": "`thinking_start", "`end_ids": "`thinking_end",
                   "`message_ids": "`thinking_budget_message"}


def _thinking_budget(v: Mapping[str, Any], tokenizer: Any, prompt_length: int | None) -> ThinkingBudgetLogitsProcessor:
    try:
        budget = ThinkingBudgetLogitsProcessor(v["thinking_budget"], v["thinking_start"], v["thinking_end"],
                                               v["thinking_budget_message"], tokenizer=tokenizer,
                                               prompt_length=prompt_length)
    except (TypeError, ValueError) as error:
        text = str(error)
        for old, new in _THINKING_NAMES.items():
            text = text.replace(old, new)
        if tokenizer is None and "tokenizer=" in text:
            text = text.rstrip(".") + " (the default tags are the strings '<think>' and '</think>')."
        raise type(error)(text) from None
    return _named(budget, {"budget": "thinking_budget"})


_BEFORE_PENALTIES = ("UnbatchedClassifierFreeGuidanceLogitsProcessor", "SequenceBiasLogitsProcessor",
                     "EncoderRepetitionPenaltyLogitsProcessor", "RepetitionPenaltyLogitsProcessor")
_TRUNCATION = ("TopHLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper", "TypicalLogitsWarper",
               "EpsilonLogitsWarper", "EtaLogitsWarper")
_WARPERS = ("TemperatureLogitsWarper", *_TRUNCATION)
_TAIL = ("WatermarkLogitsProcessor", "SynthIDTextWatermarkLogitsProcessor", "LogitNormalization")


def add_processors(processors: LogitsProcessorList, config: GenerationConfig, *, tokenizer: Any = None,
                   generator: Any = None, prompt_length: int | None = None) -> LogitsProcessorList:
    """`processors` (HF's list, in HF's order) with the community processors in their places (in place)."""
    built = build(config, tokenizer=tokenizer, generator=generator, prompt_length=prompt_length)
    order = getattr(config, "sampler_order", None)
    if not built:
        if order is not None:
            processors[:] = sampler_order.apply_order(list(processors), order)
        return processors
    for processor in processors:
        kind = next((k for k, p in built.items() if type(p) is type(processor)), None)
        if kind is not None:
            raise ValueError(
                f"`processors=` holds a {type(processor).__name__} and the options ask for one too; pass one of them.")
    items = list(processors)

    def names() -> list[str]:
        return [type(p).__name__ for p in items]

    penalties = [built[k] for k in ("penalties", "dry") if k in built]
    if penalties:
        if "penalties" in built and built["penalties"].repetition_penalty.any(lambda x: x != 1.0):
            items = [p for p in items if type(p).__name__ != "RepetitionPenaltyLogitsProcessor"]
        anchor = [i for i, n in enumerate(names()) if n in _BEFORE_PENALTIES]
        at = anchor[-1] + 1 if anchor else 0
        items[at:at] = penalties

    def tail() -> int:
        return next((i for i, n in enumerate(names()) if n in _TAIL), len(items))

    warpers = [i for i, n in enumerate(names()) if n in _WARPERS]
    temperature = next((i for i, n in enumerate(names()) if n == "TemperatureLogitsWarper"), None)
    if "dynatemp" in built:
        if temperature is not None:
            items[temperature] = built["dynatemp"]
        else:
            temperature = warpers[0] if warpers else tail()
            items.insert(temperature, built["dynatemp"])
    at = temperature + 1 if temperature is not None else (warpers[0] if warpers else tail())
    after_temperature = [built[k] for k in ("smoothing", "top_n_sigma") if k in built]
    items[at:at] = after_temperature
    if "xtc" in built:
        truncation = [i for i, n in enumerate(names()) if n in _TRUNCATION]
        place = truncation[-1] + 1 if truncation else at + len(after_temperature)
        items.insert(place, built["xtc"])
    if "mirostat" in built:
        items.insert(tail(), built["mirostat"])
    if "adaptive_p" in built:  # last: it chooses from the final distribution (llama.cpp)
        items.insert(tail(), built["adaptive_p"])
    if "thinking_budget" in built:  # first, as llama.cpp's: what it forces, the others keep
        guidance = [i for i, n in enumerate(names()) if n == "UnbatchedClassifierFreeGuidanceLogitsProcessor"]
        items.insert(guidance[-1] + 1 if guidance else 0, built["thinking_budget"])
    if order is not None:
        items = sampler_order.apply_order(items, order)
    processors[:] = items
    return processors
