"""The `Hooks` adapter: your own `prepare_inputs` / `update` hooks, HF's generation contract.

For models that need more than the built-in adapters feed them (HF's `prepare_inputs_for_generation`
and `_update_model_kwargs_for_generation`, or your own versions of them). See `_models/adapters.py` for the
adapters' common contract (`ModelAdapter`) and the per-call `state` dict.

>>> import torch
>>> from hfbridge import Hooks, generate
>>> table = torch.randn(8, 8)
>>> def prepare(input_ids, **state):
...     return {"input_ids": input_ids[:, -1:]}
>>> generate(Hooks(lambda input_ids: table[input_ids], prepare), torch.tensor([[3]]), max_new_tokens=2).shape
torch.Size([1, 3])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from hfbridge._hf.names import ALL_CACHE_NAMES
from hfbridge._models.adapters import ModelAdapter
from hfbridge._models.cache import CacheTypeError
from hfbridge._models.cache import crop_cache as _crop
from hfbridge._models.cache import reorder_cache as _reorder
from hfbridge._models.callables import AdapterTypeError, accepts, call_signature, checked_hook, describe, parameter_list

__all__ = ["Hooks"]


class Hooks(ModelAdapter):
    """Any model, with HF-style hooks that build each call and carry the model's outputs forward.

    Mirrors HF's `prepare_inputs_for_generation` and `_update_model_kwargs_for_generation`:
    before every call, `prepare_inputs(input_ids, **state)` returns the keyword arguments of
    `model(**kwargs)`; after it, `update_state(outputs, state)` returns the state for the next step
    (for example with the cache the model returned). `state` starts with `"attention_mask"` (kept
    up to date by `generate`: the mask of the whole sequence so far) and the extra keyword arguments
    given to `generate`; `update_state` may add anything.

    Args:
        model: Called as `model(**prepare_inputs(input_ids, **state))`; returns logits, a tuple whose
            first item is the logits, a mapping with `"logits"` or a `ModelOutput`.
        prepare_inputs: `(input_ids, **state) -> dict` of call keyword arguments; `input_ids` is the
            whole sequence so far, `(batch, seq)`.
        update_state: `(outputs, state) -> state`, called after every model call. Default: keep
            the state as it is.
        reorder_state: `(state, beam_idx) -> state`, called after every beam search step:
            row `i` of every per-row entry must become row `beam_idx[i]` (`beam_idx` `(rows,)`).
            Default: reorder every entry update_state set (`past_key_values`, `cache`, ..., whatever
            its key): HF `Cache` objects and nests of batch-first tensors; anything else is refused
            with an error naming the entry.
        crop_state: `(state, length) -> state` (or `(state, length, fed) -> state`, where `fed` is
            how many positions the model has been fed so far), for assisted and prompt-lookup decoding: forget
            every position from `length` on (the rejected draft tokens); `prepare_inputs` then
            feeds `input_ids[:, length:]`. Default: crop `state["past_key_values"]` (or
            `state["cache"]`, HF's name since transformers 5.24): an HF `Cache` or tensors
            `(..., seq, dim)`, see `crop_cache`; a state that carries anything else from
            update_state (a cache under another key, a counter) needs this hook.

    >>> import torch
    >>> from hfbridge import Hooks, generate
    >>> def model(tokens, bonus):                         # bonus: [B, V] added at every step
    ...     return torch.zeros(tokens.shape[0], tokens.shape[1], 6) + bonus[:, None, :]
    >>> def prepare_inputs(input_ids, *, bonus, step=0, **state):
    ...     return {"tokens": input_ids, "bonus": bonus.roll(step, dims=-1)}
    >>> def update_state(outputs, state):
    ...     return {**state, "step": state.get("step", 0) + 1}
    >>> bonus = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    >>> generate(Hooks(model, prepare_inputs, update_state), torch.tensor([[0]]),
    ...          max_new_tokens=3, bonus=bonus).tolist()
    [[0, 1, 2, 3]]
    """

    def __init__(self, model: Callable[..., Any], prepare_inputs: Callable[..., Mapping[str, Any]],
                 update_state: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None, *,
                 reorder_state: Callable[[dict[str, Any], torch.Tensor], dict[str, Any]] | None = None,
                 crop_state: Callable[[dict[str, Any], int], dict[str, Any]] | None = None):
        super().__init__(model)
        if not callable(prepare_inputs):
            raise TypeError(
                f"`prepare_inputs` must be callable as prepare_inputs(input_ids, **state) -> dict, "
                f"got {type(prepare_inputs).__name__}."
            )
        if update_state is not None and not callable(update_state):
            raise TypeError(
                f"`update_state` must be callable as update_state(outputs, state) -> state, "
                f"got {type(update_state).__name__}."
            )
        self.prepare_inputs = prepare_inputs
        self.update_state = update_state
        self.reorder_state = checked_hook(reorder_state, "reorder_state", "reorder_state(state, beam_idx) -> state")
        self.crop_state = checked_hook(crop_state, "crop_state", "crop_state(state, length) -> state")
        self.hook_signature = call_signature(prepare_inputs)
        crop_signature = call_signature(crop_state) if crop_state is not None else None
        self._crop_takes_fed = crop_signature is not None and len(
            [p for p in crop_signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        ) >= 3
        self._start: dict[str, Any] = {}  # the model inputs this call's state started with
        self._fed: int | None = None  # positions the model has seen in this call

    def reorder_cache(self, state: dict[str, Any], beam_idx: torch.Tensor) -> dict[str, Any]:
        if self.reorder_state is not None:
            new_state = self.reorder_state(state, beam_idx)
            if not isinstance(new_state, dict):
                raise AdapterTypeError(f"reorder_state must return the state dict, got {describe(new_state)}.")
            return new_state
        # Whatever update_state carries from one call to the next follows the beams, whatever its key
        # (`past_key_values`, `cache`, ...): a cache left in the old beam order gives wrong beams silently.
        for key in self.carried(state):
            try:
                state[key] = _reorder(state[key], beam_idx, where=f"state[{key!r}]")
            except CacheTypeError as error:
                raise CacheTypeError(
                    f"{error} (Hooks reorders every state entry that update_state carries: HF Cache objects and "
                    "nests of batch-first tensors; pass Hooks(..., reorder_state=lambda state, beam_idx: ...) for "
                    "anything else.)"
                ) from None
        return state

    def carried(self, state: dict[str, Any]) -> list[str]:
        """The state entries update_state set (not `attention_mask`, not the inputs `generate` started with)."""
        return [key for key, value in state.items() if key != "attention_mask"
                and (key == "past_key_values" or key not in self._start or self._start[key] is not value)
                and value is not None]

    def check_crop(self, state: dict[str, Any]) -> None:
        if self.crop_state is not None:
            return
        others = [key for key in self.carried(state) if key not in ALL_CACHE_NAMES]
        if others or not any(name in state for name in ALL_CACHE_NAMES):
            what = (f"this Hooks state carries {', '.join(f'`{key}`' for key in others)} (set by update_state), "
                    "which hfbridge cannot roll back by itself (it crops only `past_key_values`)") if others \
                else "this Hooks state has no `past_key_values` entry to crop"
            raise TypeError(
                f"assisted and prompt-lookup decoding roll back rejected draft tokens, but {what}; pass "
                "Hooks(..., crop_state=lambda state, length: ...) that makes the model forget positions from "
                "`length` on (return the state unchanged if it recomputes)."
            )

    def crop(self, state: dict[str, Any], length: int) -> dict[str, Any]:
        state = self._cropped(state, length)
        if self._fed is not None:
            self._fed = min(self._fed, length)
        return state

    def _cropped(self, state: dict[str, Any], length: int) -> dict[str, Any]:
        if self.crop_state is not None:
            if self._crop_takes_fed:
                new_state = self.crop_state(state, length, self._fed if self._fed is not None else 0)
            else:
                new_state = self.crop_state(state, length)
            if not isinstance(new_state, dict):
                raise AdapterTypeError(f"crop_state must return the state dict, got {describe(new_state)}.")
            return new_state
        self.check_crop(state)
        # `cached`: the positions the model has seen, so that a cache laid out another way fails here, by name
        return {**state, **{name: _crop(state[name], length, cached=self._fed, where=f"state[{name!r}]")
                            for name in ALL_CACHE_NAMES if name in state}}

    @property
    def fed(self) -> int:
        """How many positions of the sequence the model has been fed in this call (0 before the first call)."""
        return self._fed or 0

    def check_inputs(self, names: list[str]) -> None:
        for name in names:
            if not accepts(self.hook_signature, name):
                raise TypeError(
                    f"generate() got `{name}`, which is neither a generation option nor a state entry that "
                    f"prepare_inputs accepts (its parameters: {parameter_list(self.hook_signature)})."
                )

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              model_inputs: dict[str, Any]) -> dict[str, Any]:
        if not accepts(self.hook_signature, "attention_mask"):
            raise TypeError(
                "prepare_inputs must accept the state's `attention_mask` (its parameters: "
                f"{parameter_list(self.hook_signature)}); add `attention_mask=None` or `**state`."
            )
        self.check_inputs(list(model_inputs))
        self._start, self._fed = dict(model_inputs), None
        return {"attention_mask": attention_mask, **model_inputs}

    def forward(self, input_ids: torch.Tensor, state: dict[str, Any]) -> Any:
        kwargs = self.prepare_inputs(input_ids, **state)
        if not isinstance(kwargs, Mapping):
            raise AdapterTypeError(
                f"prepare_inputs must return a dict of keyword arguments for the model, got {describe(kwargs)}."
            )
        refused = [name for name in kwargs if not accepts(self.signature, name)]
        if refused:
            raise AdapterTypeError(
                f"prepare_inputs returned `{refused[0]}`, which the model does not accept "
                f"(the model's parameters: {parameter_list(self.signature)})."
            )
        return self.model(**kwargs)

    def update(self, outputs: Any, input_ids: torch.Tensor, state: dict[str, Any]) -> dict[str, Any]:
        self._fed = input_ids.shape[1]  # the positions the model has seen (the adapter's own, not in `state`)
        if self.update_state is None:
            return state
        new_state = self.update_state(outputs, state)
        if not isinstance(new_state, dict):
            raise AdapterTypeError(f"update_state must return the state dict, got {describe(new_state)}.")
        return new_state
