"""A vLLM request's hfbridge options: read from `SamplingParams.extra_args["hfbridge"]`, checked, keyed.

The options are hfbridge's and HF's own names (`repetition_penalty`, `dry_multiplier`, `top_p`, ...).
The names, their checks, the description of a request and its `Sampler` are every engine's
(`hfbridge._step.plan.engine_requests`, shared with SGLang); what is vLLM's is where the options live,
vLLM's own sampling fields, and the options vLLM does not take. `check_request` runs every check
that can run before the request does (in vLLM's front end, which sees only the `SamplingParams`):
the names, the values (hfbridge's own checks, by building the `Sampler` the options describe), one
value per request, plain data, and the combinations with vLLM's own sampling fields that would be
ambiguous. What needs the model (token ids against the vocabulary, DRY's string breakers against
the tokenizer) is checked when the request reaches the
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

import json
import math
from collections.abc import Mapping
from typing import Any

from hfbridge._step.plan.engine_requests import (
    EOS_OPTIONS,
    LENGTH_OPTIONS,
    Engine,
    RequestOptions,
    accepted_names,
    build_sampler,
    check_options,
    refuse_fields,
)

__all__ = ["EOS_OPTIONS", "KEY", "LENGTH_OPTIONS", "RequestOptions", "accepted_names", "build_sampler",
           "check_request", "read_options", "validate_params"]

KEY = "hfbridge"  # SamplingParams.extra_args[KEY] holds the options

# The options a request may not carry, and why, are the registry's (`hf_option_rows`: `request_refused`, worded
# with these fields); besides them, vLLM's own:
_REFUSED = {"thinking_options": "vLLM's processor runs one chain per request, not one per phase, yet"}

_VLLM = Engine(name="vLLM", where=f"`extra_args[{KEY!r}]`", refused=_REFUSED,
               greedy_fix="set `SamplingParams(temperature=1.0)` (it is 0) to sample from hfbridge's scores",
               temperature="vLLM's `SamplingParams.temperature`", max_tokens="vLLM's `SamplingParams.max_tokens`")

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
    return check_options(options, do_sample=_check_vllm_fields(params), engine=_VLLM)


def _check_vllm_fields(params: Any) -> bool:
    """Refuse vLLM's own filters and penalties next to hfbridge's options; return whether it samples."""
    temperature = getattr(params, "temperature", 1.0)
    if temperature is None or (temperature >= _GREEDY_BELOW and temperature != 1.0) or math.isnan(temperature):
        raise ValueError(
            f"`SamplingParams.temperature`={temperature!r} with hfbridge options: vLLM would divide hfbridge's "
            f"scores by it after the chain. Leave it at 1.0 (sample from hfbridge's scores) or 0 (greedy), and "
            f"pass hfbridge's `temperature` in `extra_args[{KEY!r}]`.")
    refuse_fields(params, _VLLM_FIELDS, _VLLM, label="`SamplingParams.{}`", how="after hfbridge's chain")
    return temperature >= _GREEDY_BELOW


def validate_params(params: Any) -> None:
    """`validate_params` of both runners' processors: `check_request`, every refusal a `ValueError`.

    vLLM turns a `ValueError` (not a `TypeError`) into a client error, HTTP 400.
    """
    try:
        check_request(params)
    except TypeError as error:
        raise ValueError(str(error)) from None
