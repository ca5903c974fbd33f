"""An SGLang request's hfbridge options: the keys of its `custom_params`, checked, keyed.

The options are hfbridge's and HF's own names, as vLLM requests give them (the names, their checks, the
description of a request and its `Sampler` are shared: `hfbridge._step.plan.engine_requests`); what differs is
where they live and what SGLang does around the processor: SGLang divides the processed scores by its
`temperature` and applies its own top-k, top-p, min-p and penalties afterwards, so a request with
hfbridge options leaves those at their defaults (greedy: `temperature=0`, which SGLang turns into
`top_k=1`) and passes hfbridge's `temperature`, `top_p`, ... in `custom_params`. Keys that start with
`__` are SGLang's own (`__req__`, the request; `__sglang_...`) and are not options.

Nothing here imports SGLang: `sampling_params` is anything with SGLang's `SamplingParams` attributes.

>>> from types import SimpleNamespace
>>> params = SimpleNamespace(temperature=1.0, top_k=1, top_p=1.0, min_p=0.0, frequency_penalty=0.0,
...                          presence_penalty=0.0, repetition_penalty=1.0, min_new_tokens=0)
>>> request = check_params({"repetition_penalty": 1.3, "__req__": None}, params)
>>> request.do_sample, request.options
(False, {'repetition_penalty': 1.3})
>>> check_params({"__sglang_reasoning_end_token_ids": [7]}, params) is None
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hfbridge._step.plan.engine_requests import Engine, RequestOptions, build_sampler, check_options, refuse_fields

__all__ = ["RequestOptions", "build_sampler", "check_params", "options_of"]

_TOP_K_ALL = 1 << 30  # SGLang's "no top-k" (`sampling_params.TOP_K_ALL`)

# The options a request may not carry, and why: the registry's (`hf_option_rows`: `request_refused`), worded with
# SGLang's fields.
_SGLANG = Engine(name="SGLang", where="`custom_params`", refused={},
                 greedy_fix="set SGLang's `temperature` to 1.0 to sample from hfbridge's scores",
                 temperature="SGLang's `temperature`", max_tokens="SGLang's `max_new_tokens`")

# SGLang's own sampling fields, their "off" test, and where the same thing lives in hfbridge's options.
_SGLANG_FIELDS: dict[str, tuple[Any, str]] = {
    "top_p": (lambda v: v is None or v == 1.0, "top_p"),
    "min_p": (lambda v: not v, "min_p"),
    "repetition_penalty": (lambda v: v is None or v == 1.0, "repetition_penalty"),
    "presence_penalty": (lambda v: not v, "presence_penalty"),
    "frequency_penalty": (lambda v: not v, "frequency_penalty"),
    "min_new_tokens": (lambda v: not v, "min_new_tokens"),
}


def options_of(custom_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The hfbridge options among a request's `custom_params` (SGLang's own `__` keys left out)."""
    if not custom_params:
        return {}
    if not isinstance(custom_params, Mapping):
        raise TypeError(f"`custom_params` must be a dict of hfbridge option names and values, got "
                        f"{type(custom_params).__name__}.")
    return {name: value for name, value in custom_params.items()
            if not (isinstance(name, str) and name.startswith("__"))}


def check_params(custom_params: Mapping[str, Any] | None, sampling_params: Any) -> RequestOptions | None:
    """Check one request's options (see the module); None when it has none.

    Raises:
        TypeError, ValueError: naming the option (or SGLang's sampling field) and what it expects.
    """
    options = options_of(custom_params)
    if not options:
        return None
    return check_options(options, do_sample=_check_sglang_fields(sampling_params), engine=_SGLANG)


def _check_sglang_fields(params: Any) -> bool:
    """Refuse SGLang's own filters and penalties next to hfbridge's options; return whether it samples."""
    temperature = getattr(params, "temperature", 1.0)
    if temperature != 1.0:  # SGLang turns a temperature of 0 into 1 with top_k=1 when the request is made
        raise ValueError(
            f"SGLang's `temperature`={temperature!r} with hfbridge options: SGLang would divide hfbridge's scores by "
            "it after the chain. Leave it at 1.0 (sample from hfbridge's scores) or 0 (greedy), and pass hfbridge's "
            "`temperature` in `custom_params`.")
    refuse_fields(params, _SGLANG_FIELDS, _SGLANG, label="SGLang's `{}`", how="apart from hfbridge's chain")
    top_k = getattr(params, "top_k", _TOP_K_ALL)
    if top_k not in (1, -1, _TOP_K_ALL, None):
        raise ValueError(f"SGLang's `top_k`={top_k!r} with hfbridge options: SGLang applies it after hfbridge's chain. "
                         "Pass `top_k` in `custom_params` instead.")
    return top_k != 1
