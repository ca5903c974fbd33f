"""A vLLM request's hfbridge options: read from `SamplingParams.extra_args["hfbridge"]`, checked, keyed.

The options are hfbridge's and HF's own names (`repetition_penalty`, `dry_multiplier`, `top_p`, ...).
`check_request` runs every check that can run before the request does (in vLLM's front end, which
sees only the `SamplingParams`): the names, the values (hfbridge's own checks, by building the
`Sampler` the options describe), one value per request, plain data, and the combinations with
vLLM's own sampling fields that would be ambiguous. What needs the model (token ids against the
vocabulary, DRY's string breakers against the tokenizer) is checked when the request reaches the
worker (`_batch.py`).

Nothing here imports vLLM: `params` is anything with `SamplingParams`' attributes.

>>> from types import SimpleNamespace
>>> params = SimpleNamespace(extra_args={"hfbridge": {"repetition_penalty": 1.3}}, temperature=0.0,
...                          top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
...                          frequency_penalty=0.0)
>>> request = check_request(params)
>>> request.do_sample, request.options
(False, {'repetition_penalty': 1.3})
>>> check_request(SimpleNamespace(extra_args=None)) is None
True
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping
from typing import Any

from hfbridge._step import community_options
from hfbridge._step.build_processors import step_option_names
from hfbridge._step.option_checks import did_you_mean
from hfbridge._step.option_table import hf_sampling_options, sampling_options
from hfbridge._step.sampler import Sampler

KEY = "hfbridge"  # SamplingParams.extra_args[KEY] holds the options

# HF's options that only change the scores (looked up on the installed transformers: `top_h` is new)
_HF_OPTIONS = ("repetition_penalty", "no_repeat_ngram_size", "sequence_bias", "bad_words_ids", "suppress_tokens",
               "begin_suppress_tokens", "min_new_tokens", "min_length", "exponential_decay_length_penalty",
               "eos_token_id", "remove_invalid_values", "renormalize_logits", *hf_sampling_options())

# Options whose processor counts the request's tokens from where its prompt ends.
LENGTH_OPTIONS = ("min_new_tokens", "min_length", "begin_suppress_tokens", "exponential_decay_length_penalty")
# Options that need the end-of-sequence ids (the request's stop tokens unless `eos_token_id` is given).
EOS_OPTIONS = ("min_new_tokens", "min_length", "exponential_decay_length_penalty")
# Options whose value is a list by nature; every other option takes one plain value per request.
_LIST_OPTIONS = ("sequence_bias", "bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "eos_token_id",
                 "exponential_decay_length_penalty", "dry_sequence_breakers")

_REFUSED = {
    "do_sample": "vLLM's `SamplingParams.temperature` decides: 0 is greedy, 1 samples from hfbridge's scores",
    "max_new_tokens": "vLLM's `SamplingParams.max_tokens` ends the request",
    "max_length": "vLLM's `SamplingParams.max_tokens` ends the request",
    "forced_eos_token_id": "it needs HF's `max_length`; vLLM's `SamplingParams.max_tokens` ends the request",
    "forced_bos_token_id": "it applies at the first position of encoder-decoder outputs only",
    "guidance_scale": "classifier-free guidance needs a second model call per step, which vLLM does not make",
    "watermarking_config": "watermarking is not offered inside vLLM",
    "thinking_options": "vLLM's processor runs one chain per request, not one per phase, yet",
}

# vLLM's own sampling fields, their "off" test, and where the same thing lives in hfbridge's options.
_VLLM_FIELDS: dict[str, tuple[Any, str]] = {
    "top_k": (lambda v: v in (0, -1, None), "top_k"),
    "top_p": (lambda v: v is None or v == 1.0, "top_p"),
    "min_p": (lambda v: not v, "min_p"),
    "repetition_penalty": (lambda v: v is None or v == 1.0, "repetition_penalty"),
    "presence_penalty": (lambda v: not v, "presence_penalty"),
    "frequency_penalty": (lambda v: not v, "frequency_penalty"),
}
_GREEDY_BELOW = 1e-5  # vLLM's `_SAMPLING_EPS`: a temperature under it is greedy


@functools.cache
def accepted_names() -> frozenset[str]:
    """Every option name a request may set (HF's on the installed transformers, and hfbridge's samplers).

    >>> {"dry_multiplier", "repetition_penalty", "top_p"} <= accepted_names()
    True
    """
    return frozenset(name for name in _HF_OPTIONS if name in step_option_names()) | frozenset(
        community_options.OPTIONS)


@dataclasses.dataclass(frozen=True)
class RequestOptions:
    """One request's checked options.

    Attributes:
        options: The options as the request gave them (plain data; never modified).
        do_sample: Whether vLLM samples (its temperature is 1) or takes the argmax (0).
        key: A canonical text of the options and the mode: requests with equal keys share a chain.
        counts_from_prompt: Some processor counts tokens from where the prompt ends (`min_new_tokens`,
            presence/frequency penalties without `penalty_last_n`, ...): rows share a call only with
            rows of the same prompt length and the same number of generated tokens.
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


def read_options(params: Any) -> Mapping[str, Any] | None:
    """The request's hfbridge options, or None when it has none (no `extra_args["hfbridge"]`, or empty).

    The options are a dict, or the same dict as a JSON string: the OpenAI-compatible server's
    `vllm_xargs` takes no nested dict, but takes strings.

    >>> from types import SimpleNamespace
    >>> read_options(SimpleNamespace(extra_args={"hfbridge": '{"top_n_sigma": 1.0}'}))
    {'top_n_sigma': 1.0}
    """
    extra = getattr(params, "extra_args", None)
    if not extra or KEY not in extra:
        return None
    options = extra[KEY]
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except json.JSONDecodeError as error:
            raise ValueError(f"`extra_args[{KEY!r}]` is a string but not JSON: {error}.") from None
    if not isinstance(options, Mapping):
        raise TypeError(f"`extra_args[{KEY!r}]` must be a dict of hfbridge option names and values (or that dict "
                        f"as a JSON string), got {type(options).__name__}.")
    return options or None


def check_request(params: Any) -> RequestOptions | None:
    """Check one request's options (see the module); None when it has none.

    Raises:
        TypeError, ValueError: naming the option (or the `SamplingParams` field) and what it expects.
    """
    options = read_options(params)
    if options is None:
        return None
    for name, value in options.items():
        _check_name(name)
        _check_plain(name, value)
    do_sample = _check_vllm_fields(params)
    if not do_sample:
        sampling = [name for name in options if name in sampling_options()]
        if sampling:
            raise ValueError(
                f"`{sampling[0]}` applies only when sampling, and the request is greedy (`SamplingParams."
                f"temperature=0`); set `SamplingParams(temperature=1.0)` to sample from hfbridge's scores, "
                f"or remove `{sampling[0]}`.")
    community_options.check_community(options)  # DRY's breakers included, before the trial leaves strings out
    request = _describe(dict(options), do_sample)
    build_sampler(request, prompt_length=0 if request.counts_from_prompt else None,
                  eos_token_id=0 if request.needs_eos and "eos_token_id" not in options else None,
                  tokenizer=None, generator=None, check_only=True)
    return request


def _check_name(name: Any) -> None:
    if not isinstance(name, str):
        raise TypeError(f"`extra_args[{KEY!r}]` keys must be option names (str), got {name!r}.")
    if name in _REFUSED:
        raise ValueError(f"`{name}` is not taken in vLLM: {_REFUSED[name]}.")
    if name not in accepted_names():
        raise ValueError(f"`{name}` is not an hfbridge option vLLM requests take.{did_you_mean(name, accepted_names())}"
                         f" Options: {', '.join(sorted(accepted_names()))}.")


def _check_plain(name: str, value: Any) -> None:
    """Values cross process boundaries: plain data only, and one value per request."""
    def plain(item: Any) -> bool:
        if item is None or isinstance(item, (bool, int, float, str)):
            return True
        if isinstance(item, (list, tuple)):
            return all(plain(sub) for sub in item)
        return False

    if not plain(value):
        raise TypeError(f"`{name}` must be plain data (numbers, strings, lists of them): vLLM sends it to other "
                        f"processes; got {type(value).__module__}.{type(value).__name__}.")
    if isinstance(value, (list, tuple)) and name not in _LIST_OPTIONS:
        raise TypeError(f"`{name}` takes one value per request, got a list {value!r}: each vLLM request is one row "
                        f"(send requests with different values instead).")


def _check_vllm_fields(params: Any) -> bool:
    """Refuse vLLM's own filters and penalties next to hfbridge's options; return whether it samples."""
    temperature = getattr(params, "temperature", 1.0)
    if temperature is None or (temperature >= _GREEDY_BELOW and temperature != 1.0) or math.isnan(temperature):
        raise ValueError(
            f"`SamplingParams.temperature`={temperature!r} with hfbridge options: vLLM would divide hfbridge's "
            f"scores by it after the chain. Leave it at 1.0 (sample from hfbridge's scores) or 0 (greedy), and "
            f"pass hfbridge's `temperature` in `extra_args[{KEY!r}]`.")
    for field, (off, ours) in _VLLM_FIELDS.items():
        value = getattr(params, field, None)
        if not off(value):
            raise ValueError(
                f"`SamplingParams.{field}`={value!r} with hfbridge options: vLLM applies it after hfbridge's chain, "
                f"out of HF's order. Pass `{ours}` in `extra_args[{KEY!r}]` instead.")
    return temperature >= _GREEDY_BELOW


def _describe(options: dict[str, Any], do_sample: bool) -> RequestOptions:
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
        stateful=do_sample and get("mirostat") == 2,
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


def validate_params(params: Any) -> None:
    """`validate_params` of both runners' processors: `check_request`, every refusal a `ValueError`.

    vLLM turns a `ValueError` (not a `TypeError`) into a client error, HTTP 400.
    """
    try:
        check_request(params)
    except TypeError as error:
        raise ValueError(str(error)) from None
