"""The arguments of `generate`, checked before anything runs: each wrong one gets an error naming it.

`checked_arguments` is step 1 of `generate` (`_generate/generate.py`): the prompt and its mask, `**kwargs`
split into generation options (fields of the installed `GenerationConfig`) and model inputs, with a
did-you-mean hint for names neither knows, the streamer, the generator and the layout.

>>> import torch
>>> split_kwargs({"top_k": 5, "past_key_values": None})
({'top_k': 5}, {'past_key_values': None})
>>> check_input_ids(torch.tensor([1, 2, 3]))
Traceback (most recent call last):
...
ValueError: `input_ids` must be (batch, seq), got shape (3,) (for one prompt, pass input_ids[None]).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from transformers import GenerationConfig

from hfbridge._generate.options import option_names
from hfbridge._hf.stand_in import generation_option_names
from hfbridge._models.adapters import ModelAdapter
from hfbridge._step.checks.option_checks import (
    check_config_options,
    check_flag,
    check_options,
    check_tokenizer,
    did_you_mean,
)
from hfbridge._step.plan.community_options import OPTIONS as COMMUNITY_OPTIONS
from hfbridge._step.plan.hf_option_rows import HF_OPTION_ROWS
from hfbridge._step.plan.option_table import ROWS
from hfbridge._step.run.layout import Layout
from hfbridge._step.run.per_row_draw import check_generators

__all__ = ["check_carried_options", "check_config", "check_input_ids", "checked_arguments", "has_default_max_length",
           "split_kwargs"]

# `generate`'s own keyword parameters, and HF names users carry over, for did-you-mean hints.
_PARAMETERS = option_names()
_HF_NAMES = {"inputs": "input_ids", "max_tokens": "max_new_tokens"}


def check_input_ids(input_ids: Any) -> None:
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"`input_ids` must be a (batch, seq) tensor of token ids, got {type(input_ids).__name__}.")
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"`input_ids` must hold integer token ids, got dtype {input_ids.dtype}.")
    if input_ids.ndim != 2:
        hint = " (for one prompt, pass input_ids[None])" if input_ids.ndim == 1 else ""
        raise ValueError(f"`input_ids` must be (batch, seq), got shape {tuple(input_ids.shape)}{hint}.")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(
            f"`input_ids` of shape {tuple(input_ids.shape)} is empty; generate() needs at least one prompt "
            "with at least one token (e.g. a BOS token)."
        )
    if bool((input_ids < 0).any()):
        raise ValueError(f"`input_ids` hold a negative token id ({int(input_ids.min())}); token ids are >= 0.")


def _checked_mask(attention_mask: Any, input_ids: torch.Tensor) -> torch.Tensor:
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"`attention_mask` must be a tensor of 0/1, got {type(attention_mask).__name__}.")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"`attention_mask` must have the shape of `input_ids` {tuple(input_ids.shape)}, "
            f"got {tuple(attention_mask.shape)}."
        )
    if attention_mask.device != input_ids.device:
        raise ValueError(
            f"`attention_mask` is on {attention_mask.device} but `input_ids` are on {input_ids.device}; "
            "move one of them."
        )
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError("`attention_mask` must hold only 0 (padding) and 1 (token).")
    empty = ~(attention_mask != 0).any(dim=-1)
    if bool(empty.any()):
        raise ValueError(
            f"`attention_mask` row {int(empty.nonzero()[0, 0])} is all zeros: every prompt needs at least one token."
        )
    return attention_mask


def check_inferred_mask(attention_mask: torch.Tensor, pad_token_id: Any) -> torch.Tensor:
    """The mask HF inferred from `pad_token_id` (no `attention_mask` passed), refused as a passed one where a row
    is all zeros: a prompt made only of pad tokens (an encoder-decoder's decoder starts with its pad token)."""
    empty = ~(attention_mask != 0).any(dim=-1)
    if bool(empty.any()):
        pad = pad_token_id.tolist() if isinstance(pad_token_id, torch.Tensor) else pad_token_id
        raise ValueError(
            f"no `attention_mask` was passed, and the one inferred from pad_token_id={pad} (every pad token is "
            f"padding, as in HF's generate) is all zeros in row {int(empty.nonzero()[0, 0])}: that prompt is only pad "
            "tokens (an encoder-decoder's decoder starts with its pad token). Pass attention_mask= (e.g. "
            "torch.ones_like(input_ids)) or another pad_token_id."
        )
    return attention_mask


def split_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Generation options (fields of the installed `GenerationConfig`) and model inputs (the rest)."""
    known = generation_option_names() | frozenset(COMMUNITY_OPTIONS)  # + hfbridge.processors' options
    options = {name: value for name, value in kwargs.items() if name in known}
    model_inputs = {name: value for name, value in kwargs.items() if name not in known}
    for name in model_inputs:
        if name in _HF_NAMES:
            raise TypeError(f"generate() takes `{_HF_NAMES[name]}=` where HF's generate takes `{name}=`.")
        if name == "assistant_tokenizer":
            raise TypeError(
                "generate() does not support `assistant_tokenizer` (HF's universal assisted decoding, a draft with "
                "another tokenizer): the assistant must share the target's token ids."
            )
    return options, model_inputs


def _did_you_mean(name: str) -> str:
    return did_you_mean(name, [*generation_option_names(), *_PARAMETERS])


def _check_lengths(options: dict[str, Any], generation_config: GenerationConfig | None) -> None:
    value = options.get("max_new_tokens")
    if value is None and generation_config is not None:
        value = getattr(generation_config, "max_new_tokens", None)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"`max_new_tokens` must be an int >= 1, got {value!r}.")


def has_default_max_length(options: dict[str, Any], generation_config: GenerationConfig | None) -> bool:
    return options.get("max_length") is None and (generation_config is None or generation_config.max_length is None)


def _check_streamer(streamer: Any) -> None:
    if streamer is None:
        return
    if not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
        raise TypeError(
            f"`streamer` must have put(token_ids) and end() methods (a transformers streamer), "
            f"got {type(streamer).__name__}."
        )


# Options HF's `generate` implements with more than logits processors: the registry's rows (`hf_option_rows`:
# `refused`) say why they cannot work here and when they are set (`selects`, else a true value).
# (`guidance_scale` and `watermarking_config` run: `_generate/unconditional_branch.py`, `_step/plan/watermark.py`.)
_UNSUPPORTED = {name: (row.selects or bool, row.refused) for name, row in HF_OPTION_ROWS.items() if row.refused}


# Options that ask for the model's internals, which generate() does not see (the registry's rows: `internals`).
_INTERNALS = tuple(name for name, row in HF_OPTION_ROWS.items() if row.internals)


def check_config(config: GenerationConfig, tokenizer: Any) -> None:
    """The prepared config's options that need more than a value check (the strategy: `modes.strategy_of`)."""
    check_tokenizer(tokenizer)  # a name ("gpt2") instead of the tokenizer: said here, not as an AttributeError
    for name, (is_set, why) in _UNSUPPORTED.items():
        value = getattr(config, name, None)
        if is_set(value):
            raise ValueError(f"generate() does not support `{name}`={value!r}: {why}.")
    if config.stop_strings is not None and tokenizer is None:
        raise ValueError(
            f"`stop_strings`={config.stop_strings!r} needs `tokenizer=`: HF's StopStringCriteria matches the "
            "strings against the tokenizer's vocabulary. Pass the tokenizer that made `input_ids`."
        )


def check_carried_options(config: GenerationConfig | None, *, where: str, set_by_call: Iterable[str] = ()) -> None:
    """Options carried by a `GenerationConfig` that HF's merge copies without a check, checked as keywords are.

    An HF model's own `generation_config` supplies defaults; HF's merge copies its values (HF's options and the
    extra attributes of `hfbridge.processors`' samplers) onto the call's config without hfbridge's checks, so a
    wrong value there (`temperature=inf`, `top_k=True`, `mirostat=1`) would otherwise run, fail inside torch or be
    ignored. Every option of the registry (`option_table.ROWS`: the ones the step reads) is checked as a keyword
    is (`option_checks.check_config_options`), except those the call sets itself (`set_by_call`: they replace the
    model's); errors name the option and `where` it was set.

    >>> check_carried_options(GenerationConfig(top_n_sigma=-1.0), where="in the model's `generation_config`")
    Traceback (most recent call last):
    ...
    ValueError: `top_n_sigma` must be > 0.0, got -1.0 (in the model's `generation_config`).
    """
    check_config_options(config, where=where, names=[name for name in ROWS if name not in set(set_by_call)])


def checked_arguments(adapter: ModelAdapter, input_ids: Any, *, attention_mask: Any, generation_config: Any,
                      streamer: Any, generator: Any, layout: Any, fast: Any, kwargs: dict[str, Any],
                      ) -> tuple[torch.Tensor | None, dict[str, Any], dict[str, Any], Layout | None]:
    """Check `generate`'s arguments; returns the mask, the generation options, the model inputs and the layout."""
    check_input_ids(input_ids)
    check_flag("fast", fast, optional=False)
    device = input_ids.device
    if attention_mask is not None:
        attention_mask = _checked_mask(attention_mask, input_ids)
    options, model_inputs = split_kwargs(kwargs)
    check_options(options)  # types and ranges of the generation options, HF's checks follow
    for name in model_inputs:
        try:
            adapter.check_inputs([name])
        except TypeError as error:
            raise TypeError(f"{error}{_did_you_mean(name)}") from None
    _check_lengths(options, generation_config)
    for name in _INTERNALS:
        if options.get(name, getattr(generation_config, name, False)):
            raise ValueError(
                f"`{name}=True` needs the model's internals, which generate() does not see; collect them in your "
                "model (e.g. with Hooks' update_state) instead."
            )
    _check_streamer(streamer)
    check_generators(generator)  # one, or a list with one per row
    for index, one in enumerate(generator if isinstance(generator, (list, tuple)) else [generator]):
        if one is not None and torch.device(one.device).type != device.type:
            name = "generator" if isinstance(generator, torch.Generator) else f"generator[{index}]"
            raise ValueError(
                f"`{name}` is on {one.device} but `input_ids` are on {device}; "
                f"create it with torch.Generator(device={str(device)!r})."
            )
    if layout is not None and not isinstance(layout, Layout):
        layout = Layout(layout)
    return attention_mask, options, model_inputs, layout
