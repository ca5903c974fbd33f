"""What a model or hook can be called with, and the errors that say so.

`call_signature` and `accepts` read a callable's parameters (an `nn.Module`'s `forward`), so that
adapters pass only the inputs a model takes; `describe` and `parameter_list` word the errors.

>>> accepts(call_signature(lambda input_ids, attention_mask=None: None), "attention_mask")
True
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

__all__ = ["AdapterTypeError", "accepts", "call_signature", "checked_hook", "checked_state", "describe", "hook_result",
           "parameter_list"]


class AdapterTypeError(TypeError):
    """A model or hook returned something its adapter cannot use (`generate` adds the step number)."""


def call_signature(model: Any) -> inspect.Signature | None:
    """The signature a call of `model` goes through (`forward` for an `nn.Module`), or None."""
    target = model
    if isinstance(model, torch.nn.Module):
        # torch.compile wraps the module; its own forward takes (*args, **kwargs).
        target = getattr(model, "_orig_mod", model).forward
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def accepts(signature: inspect.Signature | None, name: str, *, explicitly: bool = False) -> bool:
    """Whether a call with `signature` takes the keyword argument `name`.

    With `explicitly=True` a `**kwargs` catch-all does not count. An unknown signature takes anything
    (and nothing explicitly).
    """
    if signature is None:
        return not explicitly
    parameter = signature.parameters.get(name)
    if parameter is not None and parameter.kind not in (parameter.POSITIONAL_ONLY, parameter.VAR_POSITIONAL):
        return True
    if explicitly:
        return False
    return any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())


def parameter_list(signature: inspect.Signature | None) -> str:
    if signature is None:
        return "unknown"
    return ", ".join(str(p) for p in signature.parameters.values()) or "none"


def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def checked_hook(hook: Any, name: str, contract: str) -> Any:
    if hook is not None and not callable(hook):
        raise TypeError(f"`{name}` must be callable as {contract}, got {type(hook).__name__}.")
    return hook


def hook_result(result: Any, cache: Any, name: str, contract: str) -> Any:
    """`result`, the cache a hook returned, unless it is None for a cache that was not.

    The model reads a `None` cache as "nothing seen yet" and would restart from the new tokens
    alone: wrong tokens, no error. A hook that edits the cache in place and forgets `return`
    gives exactly that.
    """
    if result is None and cache is not None:
        raise AdapterTypeError(
            f"the {name} hook returned None for a cache of type {type(cache).__name__}; it must return the cache, "
            f"`{contract}` (a hook that edits the cache in place still ends with `return cache`)."
        )
    return result


def checked_state(state: Any, adapter: Any, method: str) -> dict[str, Any]:
    """`state` if `adapter.method(...)` returned a state dict, else an `AdapterTypeError` saying so."""
    if not isinstance(state, dict):
        raise AdapterTypeError(
            f"{type(adapter).__name__}.{method} must return the state dict, got {describe(state)}."
        )
    return state
