"""`custom_generate`: hfbridge's decoding inside transformers' own `model.generate(custom_generate=...)`.

Code that calls `model.generate` (TRL's trainers, pipelines, evaluation harnesses) gets hfbridge's
options by adding one keyword: `model.generate(ids, custom_generate=hfbridge.custom_generate,
dry_multiplier=0.8, ...)`. transformers prepares the call and hands the decoding to this function,
which runs `hfbridge.generate(model, ...)` with the same options: the same tokens, the same output.

Two forms (what each receives: `hfbridge._hf.custom_generate_inputs`):

- **the callable** (transformers 4.57+): the options hfbridge adds (`dry_multiplier`, `fast`,
  `banned_strings`, `generator`, ...) and the sampling options (so that they take one value per row)
  are named in this function's signature, so transformers passes them here. transformers drops
  `tokenizer=` before calling a callable: pass `hfbridge_tokenizer=` for banned strings, stop strings,
  DRY's string breakers and string tags. `streamer`, `assistant_model`, `negative_prompt_ids` and
  `prefix_allowed_tokens_fn` do not reach a callable either (guidance and prefix constraints are
  refused; a streamer receives only the prompt).
- **the folder** (4.52+): a folder holding `custom_generate/generate.py` with the line
  `from hfbridge import custom_generate as generate`, passed as `custom_generate="folder"` with
  `trust_remote_code=True`: transformers passes every argument of `generate` as given, `tokenizer=` and
  `streamer=` included, and this function hands them all to `hfbridge.generate`.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from hfbridge import custom_generate, generate
>>> _ = torch.manual_seed(0)
>>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
...                          num_attention_heads=2, num_key_value_heads=1, eos_token_id=None, bos_token_id=None))
>>> prompt = torch.tensor([[1, 2, 3, 2]])
>>> theirs = model.generate(prompt, custom_generate=custom_generate, max_new_tokens=6,
...                         dry_multiplier=0.8, dry_sequence_breakers=[])
>>> torch.equal(theirs, generate(model, prompt, max_new_tokens=6, dry_multiplier=0.8, dry_sequence_breakers=[]))
True
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch

from hfbridge._generate.generate import generate
from hfbridge._hf import names
from hfbridge._hf.custom_generate_inputs import (
    CALLABLE_KEYWORDS_SINCE,
    FOLDER_ARGUMENTS,
    PREPARED_INPUTS,
    built,
    cache_length,
    same_settings,
    sample_parameters,
)
from hfbridge._step.plan.option_table import ROWS

__all__ = ["custom_generate"]

TOKENIZER = "hfbridge_tokenizer"  # transformers keeps `tokenizer=` from a callable: ours under this name
# hfbridge's own keywords the callable takes (besides the options of `ROWS` and the banned strings)
_OWN = ("processors", "generator", "fast", "vocab_size", "check_every", "progress", "stop_strings", "thinking_options",
        TOKENIZER)
_BANNED = ("banned_strings", "banned_regex", "banned_max_rewinds")
# `generate`'s processors that only its own arguments build, which a callable does not receive
_REFUSED_PROCESSORS = {
    "PrefixConstrainedLogitsProcessor": "`prefix_allowed_tokens_fn`",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "`guidance_scale` (with `negative_prompt_ids`)",
    "ClassifierFreeGuidanceLogitsProcessor": "`guidance_scale`",
}


def custom_generate(model: Any, input_ids: torch.Tensor | None = None, logits_processor: Any = None,
                    stopping_criteria: Any = None, generation_config: Any = None, **kwargs: Any) -> Any:
    """Decode with hfbridge inside `model.generate(..., custom_generate=custom_generate)`.

    Called by transformers, not by you (see the module). Every keyword of `hfbridge.generate` that is
    not a transformers one is taken: the options of `hfbridge.processors`' samplers
    (`dry_multiplier`, `xtc_probability`, `top_n_sigma`, `mirostat`, ...), one value per row for the
    sampling options (`temperature=[0.7, 1.0]`), `fast`, `generator`, `processors`, `vocab_size`,
    `check_every`, `banned_strings` / `banned_regex` / `banned_max_rewinds`, `stop_strings`, and
    `hfbridge_tokenizer` (the tokenizer, which transformers does not pass to a callable).

    Returns:
        What `hfbridge.generate(model, ...)` returns for the same call: the sequences, or HF's output
        object with `return_dict_in_generate=True`.

    Raises:
        RuntimeError: transformers older than 4.57 called the callable (it passes no keyword of
            its own there; the folder form works from 4.52).
        ValueError / TypeError: what `hfbridge.generate` refuses, naming the option; guidance and
            `prefix_allowed_tokens_fn`, which transformers does not hand a callable.
    """
    if "inputs" in kwargs:  # the folder form: every argument of `generate`, as the caller gave it
        return _from_folder(model, generation_config, logits_processor, stopping_criteria, kwargs)
    if names.TRANSFORMERS_VERSION < CALLABLE_KEYWORDS_SINCE:
        raise RuntimeError(
            f"hfbridge.custom_generate as a callable needs transformers >= "
            f"{'.'.join(map(str, CALLABLE_KEYWORDS_SINCE))}, and {names.TRANSFORMERS_VERSION_TEXT} is installed: "
            "before it, `generate` passes no keyword of the callable's own (dry_multiplier=...). Upgrade "
            "transformers, use the folder form (docs/transformers_generate.md), or call hfbridge.generate(model, ...).")
    if input_ids is None or generation_config is None:
        raise TypeError("hfbridge.custom_generate is called by transformers: pass it as "
                        "`model.generate(..., custom_generate=hfbridge.custom_generate)`, or call hfbridge.generate.")
    ours = {name: kwargs.pop(name) for name in list(kwargs) if name in _taken()}
    tokenizer = ours.pop(TOKENIZER, None)
    model_inputs = _model_inputs(kwargs)
    input_ids, model_inputs = _unexpanded(input_ids, model_inputs, generation_config)
    extra_processors, extra_criteria = _extras(logits_processor, stopping_criteria, generation_config, input_ids)
    processors = ours.pop("processors", None)
    if extra_processors:
        processors = [*extra_processors, *(processors or [])]
    return _run(model, input_ids, tokenizer, dict(
        generation_config=_unprepared(model, generation_config), processors=processors,
        stopping_criteria=extra_criteria or None, **ours, **model_inputs))


def _run(model: Any, input_ids: torch.Tensor, tokenizer: Any, arguments: dict[str, Any], *, hint: bool = True
         ) -> Any:
    try:
        return generate(model, input_ids, tokenizer=tokenizer, **arguments)
    except (TypeError, ValueError) as error:
        if hint and tokenizer is None and "tokenizer" in str(error):
            raise type(error)(f"{error} (transformers does not pass `tokenizer=` to a custom_generate callable: "
                              f"pass `{TOKENIZER}=` to model.generate)") from error
        raise


def _unprepared(model: Any, config: Any) -> Any:
    """The config without the `max_length` `generate` derived from `max_new_tokens` (hfbridge derives it again;
    HF would warn that both are set)."""
    if getattr(config, "max_new_tokens", None) is None:
        return config
    config = copy.deepcopy(config)
    config.max_length = getattr(getattr(model, "generation_config", None), "max_length", None)
    return config


def _taken() -> frozenset[str]:
    return frozenset((*ROWS, *_OWN, *_BANNED))


def _model_inputs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The caller's model inputs: what `generate` prepared itself is left out (hfbridge prepares it again)."""
    inputs = {}
    for name, value in kwargs.items():
        if name not in PREPARED_INPUTS:
            if name != "attention_mask" or value is not None:  # 5.x drops an all-ones mask
                inputs[name] = value
        elif name in names.ALL_CACHE_NAMES + ("cache_params",) and cache_length(value):
            raise ValueError(f"`{name}` holds {cache_length(value)} positions: hfbridge.custom_generate starts "
                             "from an empty cache (continue a cached sequence with hfbridge.generate).")
    return inputs


def _unexpanded(input_ids: torch.Tensor, model_inputs: dict[str, Any], config: Any
                ) -> tuple[torch.Tensor, dict[str, Any]]:
    """The prompts before `generate` repeated each `max(num_beams, num_return_sequences)` times (hfbridge.generate
    repeats them itself)."""
    expand = max(getattr(config, "num_beams", 1) or 1, getattr(config, "num_return_sequences", 1) or 1)
    if expand == 1:
        return input_ids, model_inputs
    rows = input_ids.shape[0]  # [B * expand, T]
    inputs = {name: value[::expand] if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == rows
              else value for name, value in model_inputs.items()}
    return input_ids[::expand], inputs


def _extras(logits_processor: Any, stopping_criteria: Any, config: Any, input_ids: torch.Tensor
            ) -> tuple[list[Any], list[Any]]:
    """The processors and criteria the caller passed to `generate`: those its config does not build. A processor of
    a class the config builds, with other settings (transformers put it in place of its own), is refused."""
    processors = list(logits_processor or [])
    criteria = list(stopping_criteria or [])
    for item in processors:
        if type(item).__name__ in _REFUSED_PROCESSORS:
            raise ValueError(
                f"{_REFUSED_PROCESSORS[type(item).__name__]} cannot run through hfbridge.custom_generate: "
                "transformers does not hand its inputs to a custom_generate callable. Call "
                "hfbridge.generate(model, ...) with it instead.")
    built_processors, built_criteria = built(config, prompt_length=input_ids.shape[1], device=input_ids.device)
    criteria_types = {type(item) for item in built_criteria}  # (HF's own criteria hold the model's limits)
    return _callers(processors, built_processors), [item for item in criteria if type(item) not in criteria_types]


def _callers(prepared: list[Any], from_config: list[Any]) -> list[Any]:
    own = {type(item): item for item in from_config}
    for item in prepared:
        if type(item) in own and not same_settings(item, own[type(item)]):
            raise ValueError(
                f"`logits_processor` holds a {type(item).__name__}, which the generation options also build: "
                "hfbridge.custom_generate builds the chain from the options, so set the option instead of passing "
                "the object (or call hfbridge.generate with it).")
    return [item for item in prepared if type(item) not in own]


def _from_folder(model: Any, generation_config: Any, logits_processor: Any, stopping_criteria: Any,
                 kwargs: dict[str, Any]) -> Any:
    arguments = dict(kwargs)
    inputs = arguments.pop("inputs")
    if inputs is None:
        inputs = arguments.pop("input_ids", None)
    if arguments.pop("use_model_defaults", None) not in (None, True):
        raise ValueError("`use_model_defaults=False` is not taken by hfbridge.custom_generate: the model's "
                         "generation_config always supplies the defaults, as in hfbridge.generate.")
    for name in FOLDER_ARGUMENTS:
        if name in arguments and arguments[name] is None:
            del arguments[name]
    tokenizer = arguments.pop("tokenizer", None)
    if TOKENIZER in arguments:
        hf_name = arguments.pop(TOKENIZER)
        if tokenizer is not None and hf_name is not tokenizer:
            raise TypeError(f"`tokenizer=` and `{TOKENIZER}=` name two tokenizers; pass one.")
        tokenizer = hf_name
    return _run(model, inputs, tokenizer, dict(generation_config=generation_config, processors=logits_processor,
                                                stopping_criteria=stopping_criteria, **arguments), hint=False)


def _signature() -> inspect.Signature:
    """The callable's signature as transformers reads it: its parameters plus every keyword it takes."""
    own = inspect.signature(custom_generate)
    listed = [parameter for parameter in own.parameters.values() if parameter.kind is not parameter.VAR_KEYWORD]
    taken = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in sorted(_taken())
             if name not in sample_parameters()]
    return own.replace(parameters=[*listed, *taken, own.parameters["kwargs"]])


custom_generate.__signature__ = _signature()  # type: ignore[attr-defined]
