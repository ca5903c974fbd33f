"""`ReturnsCache`: the adapter for a model that returns its cache and takes it back.

See `adapters.py` for the adapters' protocol and the table of the built-in ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hfbridge._hf.caches import forgets_past
from hfbridge._models.adapters import _CACHE, _FED, _STILL, ModelAdapter
from hfbridge._models.cache import CacheTypeError, check_croppable, not_growing
from hfbridge._models.cache import crop_cache as _crop
from hfbridge._models.cache import reorder_cache as _reorder
from hfbridge._models.callables import AdapterTypeError, accepts, checked_hook, describe, hook_result, parameter_list

__all__ = ["ReturnsCache"]


class ReturnsCache(ModelAdapter):
    """A model that returns its cache and takes it back: `model(input_ids, cache) -> (logits, cache)`.

    The first call feeds the whole prompt with `cache=None`; each later call feeds only the new
    token, `(batch, 1)`, with the cache the previous call returned (any object: a tuple of tensors,
    an HF `DynamicCache`, ...). The cache is passed as the second positional argument. When the
    model's signature names an `attention_mask` parameter it also receives the `(batch, seq)` mask
    of the whole sequence so far (including the new token), as HF models expect. The signature is
    read through `functools.wraps` (`__wrapped__`, `__signature__`); a step whose signature cannot
    tell (only `*args` / `**kwargs`) gets a left-padded batch refused unless `attention_mask=True`
    or `False` says whether it takes the mask.

    Beam search reorders the cache's batch rows after every step: HF `Cache` objects and nests of
    tuples / lists / dicts of batch-first tensors automatically, any other cache through
    `reorder_cache`. Assisted and prompt-lookup decoding drop rejected positions from the cache:
    HF `Cache` objects and tensors `(..., seq, dim)` in such nests automatically, any other cache
    through `crop_cache`.

    Args:
        model: `model(input_ids, cache, **model_inputs) -> (logits, cache)`.
        reorder_cache: `reorder_cache(cache, beam_idx) -> cache`, `beam_idx` `(rows,)`: the cache
            whose row `i` is row `beam_idx[i]` of `cache`. Default: `hfbridge`'s automatic one.
        crop_cache: `crop_cache(cache, length) -> cache`: the cache holding only its first
            `length` positions. Default: `hfbridge`'s automatic one (`hfbridge.crop_cache`).
        attention_mask: Whether the step takes `attention_mask=`. Default: None, read from its
            signature (a step that names it takes it; one without `**kwargs` does not).

    >>> import torch
    >>> from hfbridge import ReturnsCache, generate
    >>> table = torch.randn(10, 10)
    >>> def model(input_ids, cache):              # the "cache" counts the tokens seen so far
    ...     seen = (0 if cache is None else cache) + input_ids.shape[1]
    ...     return table[input_ids], seen
    >>> out = generate(ReturnsCache(model), torch.tensor([[1, 2]]), max_new_tokens=3,
    ...                return_dict_in_generate=True)
    >>> out.sequences.shape      # the last cache: out.past_key_values (out.cache on transformers >= 5.24)
    torch.Size([1, 5])
    """

    def __init__(self, model: Callable[..., Any], *,
                 reorder_cache: Callable[[Any, torch.Tensor], Any] | None = None,
                 crop_cache: Callable[[Any, int], Any] | None = None, attention_mask: bool | None = None):
        super().__init__(model)
        if attention_mask is not None and not isinstance(attention_mask, bool):
            raise TypeError(f"`attention_mask` must be True, False or None, got {type(attention_mask).__name__}.")
        named = accepts(self.signature, "attention_mask", explicitly=True)
        # a catch-all signature (a decorator without functools.wraps) cannot say whether the step uses the mask
        self.mask_unknown = attention_mask is None and not named and accepts(self.signature, "attention_mask")
        self.takes_mask = named if attention_mask is None else attention_mask
        self.reorder_hook = checked_hook(reorder_cache, "reorder_cache", "reorder_cache(cache, beam_idx) -> cache")
        self.crop_hook = checked_hook(crop_cache, "crop_cache", "crop_cache(cache, length) -> cache")

    def check_crop(self, state: dict[str, Any]) -> None:
        """After the first call, before any rollback: the automatic crop must be able to crop this cache."""
        if self.crop_hook is not None:
            return
        if forgets_past(state.get(_CACHE)):
            raise CacheTypeError(
                f"the model's cache ({type(state[_CACHE]).__name__}) has sliding-window layers that drop the positions "
                "a rollback (of rejected draft tokens, or of a banned string) needs; call "
                "cache.activate_past_recording() on the cache your step creates, before its first forward (as HF's "
                "assisted loop does), or pass ReturnsCache(model, crop_cache=...)."
            )
        check_croppable(state[_CACHE], state[_FED])

    def reorder_cache(self, state: dict[str, Any], beam_idx: torch.Tensor) -> dict[str, Any]:
        if self.reorder_hook is None:
            state[_CACHE] = _reorder(state[_CACHE], beam_idx)
            return state
        state[_CACHE] = hook_result(self.reorder_hook(state[_CACHE], beam_idx), state[_CACHE], "reorder_cache",
                                    "reorder_cache(cache, beam_idx) -> cache")
        return state

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              model_inputs: dict[str, Any]) -> dict[str, Any]:
        if self.mask_unknown and bool((attention_mask == 0).any()):
            raise ValueError(
                f"the batch is left-padded, but the ReturnsCache step's signature ({parameter_list(self.signature)}) "
                "does not say whether it takes `attention_mask` (a decorator without functools.wraps?); pass "
                "ReturnsCache(model, attention_mask=True) to give it the mask, or attention_mask=False if it ignores "
                "padding."
            )
        state = super().start(input_ids, attention_mask, model_inputs)
        state[_CACHE] = None
        return state

    def forward(self, input_ids: torch.Tensor, state: dict[str, Any]) -> Any:
        ids = input_ids[:, state[_FED]:]  # [B, S]: the prompt first, then one token
        kwargs = self.model_inputs(state)
        if self.takes_mask:
            kwargs["attention_mask"] = state["attention_mask"]  # [B, T]: the whole sequence
        return self.model(ids, state[_CACHE], **kwargs)

    def update(self, outputs: Any, input_ids: torch.Tensor, state: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(outputs, (tuple, list)) or len(outputs) != 2:
            raise AdapterTypeError(
                f"a ReturnsCache model must return a pair (logits, cache), got {describe(outputs)}; "
                "return `logits, cache` (or use Recompute for a model that returns only logits)."
            )
        if outputs[1] is None:
            # the next call would feed the new token alone with cache=None: "nothing seen yet", wrong tokens
            raise AdapterTypeError(
                f"a ReturnsCache model must return its cache, got (logits, None) after {input_ids.shape[1]} tokens; "
                "return the cache it built (an HF model: pass use_cache=True), or use Recompute for a model "
                "without one."
            )
        if self.crop_hook is None and state[_CACHE] is not None:  # what the automatic crop would cut, checked
            state[_STILL] = not_growing(state[_CACHE], outputs[1], input_ids.shape[1] - state[_FED])
        state[_CACHE] = outputs[1]
        return super().update(outputs, input_ids, state)

    def logits(self, outputs: Any) -> Any:
        return outputs[0]

    def cache(self, state: dict[str, Any]) -> Any:
        return state.get(_CACHE)


    def crop(self, state: dict[str, Any], length: int) -> dict[str, Any]:
        if length < state[_FED]:
            if self.crop_hook is not None:
                state[_CACHE] = hook_result(self.crop_hook(state[_CACHE], length), state[_CACHE], "crop_cache",
                                            "crop_cache(cache, length) -> cache")
            else:
                if state.get(_STILL) is not None:
                    raise CacheTypeError(
                        f"cannot drop positions from the cache: {state[_STILL]} did not grow along its "
                        "second-to-last axis by the positions fed, so that axis is not the sequence (a recurrent "
                        "state?) and hfbridge would cut the wrong one. Pass ReturnsCache(model, crop_cache=...)."
                    )
                state[_CACHE] = _crop(state[_CACHE], length, cached=state[_FED])
            state[_FED] = length
        return state
