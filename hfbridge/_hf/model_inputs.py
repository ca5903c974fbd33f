"""How the installed transformers feeds its own models inside `generate`, for hfbridge's `HFModel` adapter.

`model.generate` builds the model's keyword arguments with private helpers whose names and
signatures change between releases. Everything hfbridge relies on to call a `PreTrainedModel` the
way its own `generate` does goes through this module, and runs HF's own helper wherever one exists:

| what | used as | versions | hfbridge on each side |
| --- | --- | --- | --- |
| `_prepare_cache_for_generation` (the first cache, under the name the model takes) | `first_cache` | 4.42+ (`assistant_model`/`device` in 4.x, `generation_mode` in 5.x) | called with the parameters its signature names; absent: no first cache |
| `_update_model_kwargs_for_generation` (which output carries the cache, under which input name: `past_key_values` up to 5.23, `cache` from 5.24, `cache_params`, `state`) | `carried_cache` | every version (4.x also advances `cache_position`) | called on each output; only the cache entries are kept |
| `logits_to_keep=1` (`num_logits_to_keep` in 4.46) | `keep_logits_name` | 4.45+ | passed only when `forward` names it |
| `_prepare_position_ids_for_generation` | `step_inputs` | 5.x (4.x makes them in `prepare_inputs_for_generation`) | called when it exists |
| `prepare_inputs_for_generation` (`cache_position` at every call in 4.x; `next_sequence_length` at every call and `is_first_iteration` at the prefill in 5.x) | `step_inputs` | every version | each passed when `GenerationMixin.prepare_inputs_for_generation` names it, whatever the override names (it hands them on through `**kwargs`); checked: `model-inputs` |
| the cache HF's loop carries: the output's, else the one passed in (filled in place: the RoBERTa family) | `carried_cache` | every version | `_update_model_kwargs_for_generation` on the carried kwargs |
| beam reorder: the model's `_reorder_cache` (5.x always; 4.x for legacy tuples), else `Cache.reorder_cache` | `reorder_model_cache` | every version | XLNet's sequence-first `mems` |
| `_is_stateful` (assisted decoding refused), a class's own `generate` (refused) | `is_stateful`, `own_generate` | every version | before any model call |
| `Cache.activate_past_recording` (sliding-window and linear layers keep what a rollback needs) | `keep_for_rollback` | 5.x | called on the target's cache for assisted decoding, where it exists |
| an all-ones mask is dropped before the loop | `drops_full_mask` | 5.x | the mask is passed as `None` when the prompts have no padding |

>>> import torch
>>> from transformers import GPT2Config, GPT2LMHeadModel
>>> model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=1)).eval()
>>> inputs = step_inputs(model, torch.tensor([[1, 2, 3]]), cache={}, fed=0, attention_mask=None, keep=1,
...                      model_inputs={})
>>> inputs["input_ids"].tolist()
[[1, 2, 3]]
>>> list(carried_cache(model, model(**inputs)))[0] in ("past_key_values", "cache")
True
"""  # noqa: E501 (the table rows)

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from hfbridge._hf.contracts import check_fed, check_slicing_names
from hfbridge._hf.names import TRANSFORMERS_MAJOR as _TRANSFORMERS_MAJOR

__all__ = ["carried_cache", "drops_full_mask", "first_cache", "is_stateful", "keep_for_rollback", "keep_logits_name",
           "own_generate", "reorder_model_cache", "step_inputs"]


@functools.cache
def _parameters(function: Any) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(function).parameters)
    except (TypeError, ValueError):  # pragma: no cover - every HF model has a signature
        return frozenset()


def _forward_parameters(model: Any) -> frozenset[str]:
    return _parameters(type(model).forward)


def keep_logits_name(model: Any) -> str | None:
    """`logits_to_keep` or `num_logits_to_keep` (4.46), whichever `model.forward` takes, else None."""
    parameters = _forward_parameters(model)
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in parameters:
            return name
    return None


def first_cache(model: Any, config: Any, *, batch: int, max_length: int, device: torch.device) -> dict[str, Any]:
    """The cache HF's `generate` creates before the first call (`_prepare_cache_for_generation`), by input name.

    Args:
        model: The `PreTrainedModel`.
        config: The call's prepared `GenerationConfig` (its `use_cache`, `cache_implementation`, ...).
        batch: Prompts in the call, before `num_beams` / `num_return_sequences` expansion (HF's `batch_size`).
        max_length: The call's `max_length`; HF sizes a static cache to `max_length - 1`.
        device: The device of the prompts.

    Returns:
        `{name: cache}` (e.g. `{"past_key_values": DynamicCache}`), or `{}` where HF's `generate`
        creates none (the model then makes its own on the first call).
    """
    prepare = getattr(model, "_prepare_cache_for_generation", None)
    if prepare is None or config.use_cache is False:
        return {}
    values: dict[str, Any] = {"generation_config": config, "assistant_model": None, "batch_size": batch,
                              "max_cache_length": max_length - 1, "device": device}
    parameters = _parameters(type(model)._prepare_cache_for_generation)
    if "generation_mode" in parameters:
        values["generation_mode"] = config.get_generation_mode()
    model_kwargs: dict[str, Any] = {}
    prepare(model_kwargs=model_kwargs, **{name: value for name, value in values.items() if name in parameters})
    return {name: value for name, value in model_kwargs.items() if value is not None}


_ZERO = torch.zeros(1, dtype=torch.long)


def carried_cache(model: Any, outputs: Any, passed: dict[str, Any] | None = None) -> dict[str, Any]:
    """The cache the model's `generate` carries from `outputs` to the next call, by input name.

    HF's own `_update_model_kwargs_for_generation` decides which output field is the cache and the
    name it goes back under (`past_key_values`, `cache` from 5.24, `cache_params`, `state`, ...);
    as in HF's loop, a cache passed in (`passed`, by input name) that the output does not replace
    is carried on: a model that fills its cache in place without returning it (RoBERTa's family,
    transformers 5) is fed one new token per call, as by its own `generate`.
    Returns `{}` when there is no cache to carry.
    """
    # transformers 4.x advances `cache_position` there (and needs one); `step_inputs` makes it afresh.
    scratch: dict[str, Any] = {**(passed or {}), "use_cache": True, "cache_position": _ZERO}
    updated = model._update_model_kwargs_for_generation(outputs, scratch, is_encoder_decoder=False)
    return {name: value for name, value in updated.items()
            if name not in ("use_cache", "cache_position") and value is not None}


def reorder_model_cache(model: Any, cache: Any, beam_idx: torch.Tensor) -> Any:
    """`cache` with its rows in the order `beam_idx`, as the installed beam search reorders a model's cache.

    transformers 5 asks the model's own `_reorder_cache` first (XLNet's sequence-first `mems`, RAG),
    then the cache's `reorder_cache`; 4.x asks the model for legacy tuples and the `Cache` otherwise.
    Anything else: `hfbridge._models.cache.reorder_cache`'s rules (batch-first tensor nests), by the caller.
    Returns None where neither the model nor the cache reorders it.
    """
    own = getattr(model, "_reorder_cache", None)
    legacy = isinstance(cache, (tuple, list))
    if callable(own) and (_TRANSFORMERS_MAJOR >= 5 or legacy):
        try:
            return own(cache, beam_idx)
        except NotImplementedError:  # 4.x's GenerationMixin._reorder_cache: the model has none of its own
            pass
    if not isinstance(cache, (tuple, list, dict, torch.Tensor)) and callable(getattr(cache, "reorder_cache", None)):
        cache.reorder_cache(beam_idx)
        return cache
    return None


def own_generate(model: Any) -> str | None:
    """The qualified name of the class's own `generate` where it overrides `GenerationMixin.generate`
    (Musicgen's codebooks and delay pattern), else None: its decoding is not the one hfbridge mirrors."""
    from transformers.generation.utils import GenerationMixin

    method = getattr(type(model), "generate", None)
    if method is None or method is GenerationMixin.generate:
        return None
    return str(getattr(method, "__qualname__", type(model).__name__ + ".generate"))


def is_stateful(model: Any) -> bool:
    """HF's `_is_stateful` class flag: a recurrent model (Mamba, RecurrentGemma) that assisted decoding refuses."""
    return bool(getattr(model, "_is_stateful", False))


def keep_for_rollback(cache: dict[str, Any]) -> None:
    """Make the caches keep what assisted decoding's rollback needs, as HF's `_assisted_decoding` does (5.x)."""
    for value in cache.values():
        activate = getattr(value, "activate_past_recording", None)
        if callable(activate):
            activate()


@functools.cache
def _generate_passes() -> frozenset[str]:
    """What the installed `generate` passes every `prepare_inputs_for_generation` call, whatever the override names.

    Read from `GenerationMixin.prepare_inputs_for_generation`, the method HF's loops are written for:
    4.x keeps `cache_position` in its `model_kwargs` for every call; 5.x passes `next_sequence_length`
    at every call and `is_first_iteration` at the first (its `_prefill`). An override that does not
    name them still receives them through `**kwargs` and hands them on to the base method.
    """
    from transformers.generation.utils import GenerationMixin

    return _parameters(GenerationMixin.prepare_inputs_for_generation) & {
        "cache_position", "next_sequence_length", "is_first_iteration"}


def _prefill_length(cache: dict[str, Any], length: int) -> int | None:
    """HF's `_prefill` (5.x): the prompt's length when the cache has layers that attend, else None (no slicing)."""
    for value in cache.values():
        linear = getattr(value, "is_linear", None)
        if linear is not None and not all(linear):
            return length
    return None


def step_inputs(model: Any, input_ids: torch.Tensor, *, cache: dict[str, Any], fed: int,
                attention_mask: torch.Tensor | None, keep: int | None, model_inputs: dict[str, Any],
                use_cache: bool = True, first: bool | None = None, assisted: bool = False) -> dict[str, Any]:
    """The keyword arguments of one `model(...)` call, made by the model's own `prepare_inputs_for_generation`.

    Args:
        model: The `PreTrainedModel`.
        input_ids: The whole sequence so far, `(batch, seq)`.
        cache: The model's cache entries by input name (`first_cache`, `carried_cache`), holding the
            first `fed` positions (`{}`: nothing cached).
        fed: Positions the cache holds; the call feeds `input_ids[:, fed:]`.
        attention_mask: `(batch, seq)` mask of the whole sequence, or None where HF's `generate`
            dropped an all-ones mask (5.x).
        keep: `logits_to_keep`: 1 as HF's `generate`, the number of fed positions where every
            fed position's logits are needed (assisted decoding), None for all.
        model_inputs: The user's extra model inputs (HF's `**model_kwargs`).
        use_cache: False for `use_cache=False` (every call feeds the whole sequence, `fed` is 0).
        first: The first model call of the `generate` call (HF's prefill). Default: `fed == 0`.
        assisted: The call is one of assisted decoding's (HF's `_assisted_decoding` passes
            `is_first_iteration` at every call and no prefill length).

    Raises:
        TransformersContractError: (`model-inputs`) when the prepared inputs would feed the model
            more than the positions its cache has not seen.
    """
    first = fed == 0 if first is None else first
    new = input_ids.shape[1] - fed
    kwargs: dict[str, Any] = {**model_inputs, "use_cache": use_cache, **cache, "attention_mask": attention_mask}
    keep_name = keep_logits_name(model)
    if keep_name is not None and keep is not None:
        kwargs[keep_name] = keep
    if "position_ids" in _forward_parameters(model) and hasattr(model, "_prepare_position_ids_for_generation"):
        # transformers 5: `generate` makes the position ids of the whole prompt from the mask before
        # the loop and extends them by one per token; the same values, from the whole mask.
        full = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        kwargs["position_ids"] = model._prepare_position_ids_for_generation(input_ids, {"attention_mask": full})
    passes = _generate_passes()
    if not passes & {"cache_position", "next_sequence_length"}:
        check_slicing_names(passes)
    if "cache_position" in passes:  # transformers 4.x slices the fed tokens by it
        kwargs["cache_position"] = torch.arange(fed, input_ids.shape[1], device=input_ids.device)
    if "next_sequence_length" in passes:  # transformers 5.x slices by it
        if not use_cache or (first and assisted):
            kwargs["next_sequence_length"] = None
        elif first:
            kwargs["next_sequence_length"] = _prefill_length(cache, input_ids.shape[1])
        else:
            kwargs["next_sequence_length"] = new
    if "is_first_iteration" in passes and (first or assisted):
        kwargs["is_first_iteration"] = first
    prepared = model.prepare_inputs_for_generation(input_ids, **kwargs)
    if use_cache and not first and cache:
        check_fed(model, prepared, total=input_ids.shape[1], held=_held(cache), decides=_decides(model))
    return prepared


def _decides(model: Any) -> bool:
    """Whether the class's own override of `prepare_inputs_for_generation` names a call-protocol argument
    (`cache_position`, `next_sequence_length`, `is_first_iteration`): it reads them and decides the inputs itself."""
    from transformers.generation.utils import GenerationMixin

    prepare = type(model).prepare_inputs_for_generation
    if prepare is GenerationMixin.prepare_inputs_for_generation:
        return False
    return bool(_parameters(prepare) & {"cache_position", "next_sequence_length", "is_first_iteration"})


def _held(cache: dict[str, Any]) -> int | None:
    """Positions the cache holds (an attention `Cache`'s `get_seq_length`, a shape read), None where unreadable."""
    for value in cache.values():
        linear = getattr(value, "is_linear", None)
        if linear is not None and all(linear):
            return None
        length = getattr(value, "get_seq_length", None)
        held = length() if callable(length) else None
        if isinstance(held, (int, torch.Tensor)):
            return int(held)
    return None


def drops_full_mask() -> bool:
    """Whether the installed `generate` drops an all-ones attention mask before its loop (transformers 5)."""
    return _TRANSFORMERS_MAJOR >= 5
