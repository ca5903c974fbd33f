"""A stand-in model that lets hfbridge call transformers' own generation helpers.

`GenerationMixin` keeps the logic we must match (default generation options, special-token
handling, the order and parameters of logits processors, stopping criteria) in methods that only
look at `self.config`, `self.generation_config` and `self.device`. A tiny host object with those
three attributes can run them unchanged, so hfbridge reuses HF's code for the installed version
instead of mirroring it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PretrainedConfig, StoppingCriteriaList
from transformers.generation.utils import GenerationMixin

from hfbridge._hf import names


class ProcessorHost(GenerationMixin):
    """The smallest object on which `GenerationMixin`'s helper methods run.

    Args:
        device: Where HF puts the tensors it creates (eos ids, masks). Default: CPU.
        max_position_embeddings: Passed to HF's `MaxLengthCriteria` as the model limit. Default: None.

    >>> host = ProcessorHost()
    >>> host.config.is_encoder_decoder
    False
    """

    # transformers 5.x checks this class attribute in a few helpers.
    _is_stateful = False

    def __init__(self, device: torch.device | str | None = None, max_position_embeddings: int | None = None):
        if max_position_embeddings is None:
            self.config, self.generation_config = _default_configs()
        else:
            config = PretrainedConfig()
            config.max_position_embeddings = max_position_embeddings
            self.config, self.generation_config = config, GenerationConfig.from_model_config(config)
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    @contextlib.contextmanager
    def _optimize_model_for_decode(self) -> Iterator[None]:
        # transformers 5.24's loops switch a model's MoE kernels for decoding; a host has none.
        yield

    def _valid_auto_compile_criteria(self, *args: Any, **kwargs: Any) -> bool:
        # transformers 5.x compiles the model's forward for some caches on accelerators; the host's
        # "forward" is hfbridge's adapter call, which is not HF's to compile.
        return False

    def _as_mixin(self) -> Any:
        # transformers 5 types `self` of these GenerationMixin helpers as a PreTrainedModel; the host
        # stands in for one with the few attributes they read.
        return self

    def prepare_config(self, generation_config: GenerationConfig | None,
                       **options: Any) -> tuple[GenerationConfig, dict[str, Any]]:
        """HF's `_prepare_generation_config`: a copy with defaults filled and `options` applied.

        Returns the config and the options that are not generation options.

        With both a config and options, HF's merge is run on a copy of the config with the options
        already applied, then the options are applied again (HF's last step): the same config, without
        the deprecation warning transformers 5 logs for "a config together with options" (it would
        name options such as `do_sample` that hfbridge, not the caller, decided).
        """
        if generation_config is None or not options:
            prepared = self._as_mixin()._prepare_generation_config(generation_config, **options)
            return prepared[0], prepared[1]
        merged = copy.deepcopy(generation_config)
        unused = merged.update(**options)  # the names that are not generation options
        config = self._as_mixin()._prepare_generation_config(merged)[0]
        config.update(**{name: value for name, value in options.items() if name not in unused})
        return config, dict(unused)

    def prepare_special_tokens(self, generation_config: GenerationConfig, has_attention_mask: bool | None,
                               device: torch.device, batch_size: int | None = None) -> None:
        """HF's `_prepare_special_tokens` (sets `_eos_token_tensor`, `_pad_token_tensor`, ...) in place."""
        kwargs: dict[str, Any] = {}
        if batch_size is not None and "batch_size" in _parameters(GenerationMixin._prepare_special_tokens):
            kwargs["batch_size"] = batch_size
        self._as_mixin()._prepare_special_tokens(generation_config, has_attention_mask, device=device, **kwargs)

    def logits_processor(self, generation_config: GenerationConfig, *, prompt_length: int | None,
                         processors: Any, device: torch.device, attention_mask: torch.Tensor | None,
                         prefix_allowed_tokens_fn: Any = None) -> LogitsProcessorList:
        """HF's `_get_logits_processor`, called the way `generate` calls it for a decoder-only model."""
        model_kwargs = {"attention_mask": attention_mask} if attention_mask is not None else {}
        with warnings.catch_warnings():
            if not prompt_length:
                # HF reads a missing (or zero) length as "generating from inputs_embeds" and warns about it;
                # a step without prompt_length (or an engine's check of a request) is not that.
                warnings.filterwarnings("ignore", message=r"Passing `\w+` with `inputs_embeds`")
            return self._as_mixin()._get_logits_processor(
                generation_config,
                input_ids_seq_length=prompt_length,
                encoder_input_ids=None,
                prefix_allowed_tokens_fn=prefix_allowed_tokens_fn,
                logits_processor=processors,
                device=device,
                model_kwargs=model_kwargs,
                negative_prompt_ids=None,
                negative_prompt_attention_mask=None,
            )

    def attention_mask(self, input_ids: torch.Tensor, generation_config: GenerationConfig) -> torch.Tensor:
        """HF's `_prepare_attention_mask_for_generation` (its signature differs between versions)."""
        prepare = self._as_mixin()._prepare_attention_mask_for_generation
        ids = input_ids.long()
        if "generation_config" in _parameters(GenerationMixin._prepare_attention_mask_for_generation):
            return prepare(ids, generation_config, {})
        return prepare(ids, special_token(generation_config, "pad"), special_token(generation_config, "eos"))

    def validate_length(self, generation_config: GenerationConfig, prompt_length: int,
                        has_default_max_length: bool) -> None:
        """HF's `_validate_generated_length`: its errors and warnings about the lengths."""
        self._as_mixin()._validate_generated_length(generation_config, prompt_length, has_default_max_length)

    def stopping_criteria(self, generation_config: GenerationConfig, stopping_criteria: Any = None,
                          tokenizer: Any = None) -> StoppingCriteriaList:
        """HF's `_get_stopping_criteria` (max length, max time, stop strings, eos) merged with user criteria."""
        criteria = stopping_criteria if stopping_criteria is not None else StoppingCriteriaList()
        return self._as_mixin()._get_stopping_criteria(generation_config, stopping_criteria=criteria,
                                                       tokenizer=tokenizer)


@functools.cache
def _default_configs() -> tuple[PretrainedConfig, GenerationConfig]:
    # Built once: HF's helpers only read them, and building them costs milliseconds per host.
    config = PretrainedConfig()
    return config, GenerationConfig.from_model_config(config)


class AssistantStandIn:
    """What HF's `AssistedCandidateGenerator` asks of its assistant model besides `generate`.

    A subclass provides `generate(input_ids, **kwargs)` (hfbridge's draft loop). transformers 5.0's
    generator prepares the first draft's arguments through the assistant's
    `_get_initial_cache_position` and `prepare_inputs_for_generation`; here both pass the arguments
    through unchanged (hfbridge's draft loop computes positions itself), and the draft never keeps
    logits of fewer positions than it feeds.

    >>> AssistantStandIn().prepare_inputs_for_generation("ids", is_first_iteration=True, attention_mask=1)
    {'input_ids': 'ids', 'attention_mask': 1}
    """

    def _supports_logits_to_keep(self) -> bool:
        return False

    def _supports_num_logits_to_keep(self) -> bool:
        return False

    def _get_initial_cache_position(self, seq_length: int, device: Any, model_kwargs: dict[str, Any]) -> dict[str, Any]:
        return model_kwargs

    def prepare_inputs_for_generation(self, input_ids: Any, **model_kwargs: Any) -> dict[str, Any]:
        dropped = ("is_first_iteration", "cache_position", "next_sequence_length")
        return {"input_ids": input_ids, **{key: value for key, value in model_kwargs.items() if key not in dropped}}


def fresh_config() -> PretrainedConfig:
    """A model config of its own for a host whose config HF's loops read (`vocab_size`) or a host sets.

    >>> fresh_config().is_encoder_decoder
    False
    """
    config = PretrainedConfig()
    config.is_encoder_decoder = False
    return config


@functools.cache
def _parameters(function: Callable[..., Any]) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def special_token(config: GenerationConfig, which: str) -> torch.Tensor | None:
    """The tensor HF's `_prepare_special_tokens` set on `config` for `which` ("eos", "pad", "bos"), or None.

    >>> special_token(GenerationConfig(), "eos") is None
    True
    """
    return getattr(config, f"_{which}_token_tensor", None)


@functools.cache
def generation_option_names() -> frozenset[str]:
    """Every option name the installed `GenerationConfig` knows (public fields only).

    >>> "top_p" in generation_option_names()
    True
    """
    return frozenset(name for name in GenerationConfig().to_dict() if not name.startswith("_"))


def prepare_lengths(host: ProcessorHost, generation_config: GenerationConfig, *, user_config: GenerationConfig | None,
                    options: dict[str, Any], prompt_length: int) -> None:
    """HF's `_prepare_generated_length`, in place: `max_new_tokens`/`min_new_tokens` become lengths.

    The "has default" flags are computed as the installed `generate` computes them (they decide
    HF's warnings, and in transformers 5 whether the default `max_length` counts new tokens only).
    """

    def has_default(name: str) -> bool:
        if names.TRANSFORMERS_MAJOR < 5:
            return options.get(name) is None and getattr(generation_config, name, None) is not None
        return (
            options.get(name) is None
            and (user_config is None or getattr(user_config, name, None) is None)
            and getattr(host.generation_config, name, None) is None
        )

    host._as_mixin()._prepare_generated_length(
        generation_config=generation_config,
        has_default_max_length=has_default("max_length"),
        has_default_min_length=has_default("min_length"),
        model_input_name="input_ids",
        input_ids_length=prompt_length,
        inputs_tensor=None,
    )
