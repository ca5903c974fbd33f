"""One serving engine request's hfbridge options: the checks and the description every engine shares.

vLLM (`SamplingParams.extra_args["hfbridge"]`) and SGLang (`custom_params`) hand hfbridge one dict of
options per request, as plain data. What is the same for every engine lives here: the names a request
may set (HF's options that only change the scores, and hfbridge's samplers), the checks of each name
and value (worded for the engine: `Engine`), the refusal of sampling-only options on a greedy request,
the description of a request (`RequestOptions`: which requests may share a chain, which need a
`Sampler` of their own) and its `Sampler`. What differs (where the options live, the engine's own
sampling fields) is each engine's.

>>> engine = Engine(name="SGLang", where="`custom_params`", refused={})
>>> request = check_options({"repetition_penalty": 1.3}, do_sample=False, engine=engine)
>>> request.do_sample, request.options, request.stateful
(False, {'repetition_penalty': 1.3}, False)
>>> check_options({"top_kk": 3}, do_sample=True, engine=engine)
Traceback (most recent call last):
...
ValueError: `top_kk` is not an hfbridge option SGLang requests take. Did you mean `top_k`? ...
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

from hfbridge._step.checks.option_checks import did_you_mean
from hfbridge._step.plan import community_options
from hfbridge._step.plan.build_processors import step_option_names
from hfbridge._step.plan.hf_option_rows import HF_OPTION_ROWS, list_options, needing, request_options
from hfbridge._step.plan.option_table import sampling_options
from hfbridge._step.run.sampler import Sampler

__all__ = ["EOS_OPTIONS", "LENGTH_OPTIONS", "LIST_OPTIONS", "Engine", "RequestOptions", "accepted_names",
           "build_sampler", "check_options", "describe", "refuse_fields"]

# Options whose processor counts the request's tokens from where its prompt ends (the registry's rows say).
LENGTH_OPTIONS = needing("prompt_end")
# Options that need the end-of-sequence ids (the request's stop tokens unless `eos_token_id` is given).
EOS_OPTIONS = needing("eos")
# Options whose value is a list by nature (the rows' `list_value`); every other option takes one plain value per
# request.
LIST_OPTIONS = list_options()


@dataclasses.dataclass(frozen=True)
class Engine:
    """How an engine's errors name it.

    Attributes:
        name: The engine ("vLLM", "SGLang").
        where: Where a request's options live, as errors name it (`custom_params`).
        refused: Names the engine does not take besides the registry's (`hf_option_rows`: `request_refused`),
            each with the reason.
        greedy_fix: How to make a request sample, for the error on a sampling-only option.
        temperature: The engine's field that decides greedy or sampling, as the registry's reasons name it.
        max_tokens: The engine's field that ends a request, as the registry's reasons name it.
    """

    name: str
    where: str
    refused: Mapping[str, str]
    greedy_fix: str = "set the engine's temperature to 1.0 to sample from hfbridge's scores"
    temperature: str = "the engine's `temperature`"
    max_tokens: str = "the engine's length limit"

    def refusal(self, name: str) -> str | None:
        """Why a request may not carry option `name` (None: it is not refused).

        >>> Engine(name="SGLang", where="`custom_params`", refused={}).refusal("watermarking_config")
        'watermarking is not offered inside SGLang'
        """
        if name in self.refused:
            return self.refused[name]
        row = HF_OPTION_ROWS.get(name)
        if row is None or row.request_refused is None:
            return None
        return row.request_refused.format(engine=self.name, temperature=self.temperature, max_tokens=self.max_tokens)


@functools.cache
def accepted_names() -> frozenset[str]:
    """Every option name a request may set (HF's on the installed transformers, and hfbridge's samplers).

    >>> {"dry_multiplier", "repetition_penalty", "top_p"} <= accepted_names()
    True
    """
    return frozenset(name for name in request_options() if name in step_option_names()) | frozenset(
        community_options.OPTIONS)


@dataclasses.dataclass(frozen=True)
class RequestOptions:
    """One request's checked options.

    Attributes:
        options: The options as the request gave them (plain data; never modified).
        do_sample: Whether the engine samples from hfbridge's scores or takes the argmax.
        key: A canonical text of the options and the mode: requests with equal keys share a chain.
        counts_from_prompt: Some processor counts tokens from where the prompt ends (`min_new_tokens`,
            presence/frequency penalties without `penalty_last_n`, ...): requests share a call only with
            requests of the same prompt length and the same number of generated tokens.
        stateful: A processor keeps a state per request across steps (mirostat).
        random: A processor draws random numbers of its own (XTC).
        string_breakers: DRY's sequence breakers include strings, which need the model's tokenizer.
        needs_eos: A processor masks the end-of-sequence ids.
    """

    options: Mapping[str, Any]
    do_sample: bool
    key: str
    counts_from_prompt: bool
    stateful: bool
    random: bool
    string_breakers: bool
    needs_eos: bool


def check_options(options: Mapping[str, Any], *, do_sample: bool, engine: Engine) -> RequestOptions:
    """Check one request's options (names, plain values, each value by building their `Sampler`).

    Raises:
        TypeError, ValueError: naming the option and what it expects.
    """
    for name, value in options.items():
        _check_name(name, engine)
        _check_plain(name, value, engine)
    if not do_sample:
        sampling = [name for name in options if name in sampling_options()]
        if sampling:
            raise ValueError(f"`{sampling[0]}` applies only when sampling, and the request is greedy; "
                             f"{engine.greedy_fix}, or remove `{sampling[0]}`.")
    community_options.check_community(options)  # DRY's breakers included, before the trial leaves strings out
    request = describe(dict(options), do_sample)
    trial = build_sampler(request, prompt_length=0 if request.counts_from_prompt else None,
                          eos_token_id=0 if request.needs_eos and "eos_token_id" not in options else None,
                          tokenizer=None, generator=None, check_only=True)
    return dataclasses.replace(request, stateful=trial.is_stateful)  # the processors say it, not a list of names


def refuse_fields(params: Any, fields: Mapping[str, tuple[Callable[[Any], bool], str]], engine: Engine, *,
                  label: str, how: str) -> None:
    """Refuse the engine's own sampling fields next to hfbridge's options (the engine applies them apart from
    hfbridge's chain): `fields[name] = (off, option)`, `off(value)` true when the field is off, `option`
    hfbridge's option for the same thing. `label` names a field (`"SGLang's `{}`"`), `how` says where the
    engine applies it.

    >>> from types import SimpleNamespace
    >>> engine = Engine(name="SGLang", where="`custom_params`", refused={})
    >>> refuse_fields(SimpleNamespace(top_p=0.9), {"top_p": (lambda v: v == 1.0, "top_p")}, engine,
    ...               label="SGLang's `{}`", how="after hfbridge's chain")
    Traceback (most recent call last):
    ...
    ValueError: SGLang's `top_p`=0.9 with hfbridge options: SGLang applies it after hfbridge's chain, ...
    """
    for name, (off, option) in fields.items():
        value = getattr(params, name, None)
        if not off(value):
            raise ValueError(f"{label.format(name)}={value!r} with hfbridge options: {engine.name} applies it {how}, "
                             f"out of HF's order. Pass `{option}` in {engine.where} instead.")


def _check_name(name: Any, engine: Engine) -> None:
    if not isinstance(name, str):
        raise TypeError(f"{engine.where} keys must be option names (str), got {name!r}.")
    refusal = engine.refusal(name)
    if refusal is not None:
        raise ValueError(f"`{name}` is not taken in {engine.name}: {refusal}.")
    if name not in accepted_names():
        hint = did_you_mean(name, accepted_names())
        raise ValueError(f"`{name}` is not an hfbridge option {engine.name} requests take.{hint}"
                         f" Options: {', '.join(sorted(accepted_names()))}.")


def _check_plain(name: str, value: Any, engine: Engine) -> None:
    """Values cross process boundaries: plain data only, and one value per request."""
    def plain(item: Any) -> bool:
        if item is None or isinstance(item, (bool, int, float, str)):
            return True
        if isinstance(item, (list, tuple)):
            return all(plain(sub) for sub in item)
        return False

    if not plain(value):
        raise TypeError(f"`{name}` must be plain data (numbers, strings, lists of them): {engine.name} sends it to "
                        f"other processes; got {type(value).__module__}.{type(value).__name__}.")
    if isinstance(value, (list, tuple)) and name not in LIST_OPTIONS:
        raise TypeError(f"`{name}` takes one value per request, got a list {value!r}: each {engine.name} request is "
                        f"one row (send requests with different values instead).")


def describe(options: dict[str, Any], do_sample: bool) -> RequestOptions:
    """The description of checked options (see `RequestOptions`); `stateful` is the estimate from the options
    (mirostat, adaptive-p, the thinking budget), which `check_options` replaces with what the `Sampler` says."""
    get = options.get
    penalties = bool(get("presence_penalty")) or bool(get("frequency_penalty"))
    breakers = get("dry_sequence_breakers", community_options.OPTIONS["dry_sequence_breakers"].default)
    dry = bool(get("dry_multiplier"))
    return RequestOptions(
        options=options,
        do_sample=do_sample,
        key=json.dumps([do_sample, options], sort_keys=True),
        counts_from_prompt=any(get(name) is not None for name in LENGTH_OPTIONS)
        or (penalties and get("penalty_last_n") is None),
        stateful=(do_sample and get("mirostat") in (1, 2)) or get("adaptive_target") is not None
        or get("thinking_budget") is not None,
        random=do_sample and bool(get("xtc_probability")),
        string_breakers=dry and any(isinstance(breaker, str) for breaker in breakers),
        needs_eos=any(get(name) is not None for name in EOS_OPTIONS),
    )


def build_sampler(request: RequestOptions, *, prompt_length: int | None, eos_token_id: Any, tokenizer: Any,
                  generator: Any, check_only: bool = False) -> Sampler:
    """The `Sampler` for these options (HF's chain, HF's order, hfbridge's checks).

    `eos_token_id`: the ids `min_new_tokens` and its kin mask when the options do not name them.
    `check_only`: build it to run the checks, with DRY's string breakers left out (no tokenizer yet).
    """
    options = dict(request.options)
    if eos_token_id is not None and "eos_token_id" not in options:
        options["eos_token_id"] = eos_token_id
    if check_only and request.string_breakers:
        breakers = options.get("dry_sequence_breakers", community_options.OPTIONS["dry_sequence_breakers"].default)
        options["dry_sequence_breakers"] = [breaker for breaker in breakers if not isinstance(breaker, str)]
    return Sampler(do_sample=request.do_sample, prompt_length=prompt_length, tokenizer=tokenizer,
                   generator=generator, **options)
