"""The model and tokenizer of an `HFBridgeLM`, from objects or from lm-eval's `--model_args` strings.

On the command line every value is text: `model=my_pkg.my_module:build` names a function that
returns the model (imported, then called without arguments), `tokenizer=PATH` is a name or folder
for `transformers.AutoTokenizer.from_pretrained`.

>>> resolve_model("hfbridge.lm_eval._building:_example_model", None)(3)
6
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from hfbridge import ModelAdapter

__all__ = ["resolve_model", "resolve_tokenizer"]


def resolve_model(model: Any, device: Any) -> Any:
    """`model` itself, or what the function a `"package.module:function"` string names returns.

    A model built from a string that is an `nn.Module` is moved to `device` when one is given.
    """
    if not isinstance(model, str):
        if not isinstance(model, ModelAdapter) and not callable(model):
            raise TypeError(f"`model` must be a model (a callable, an adapter or a PreTrainedModel) or a "
                            f"'package.module:function' string, got {type(model).__name__}.")
        return model
    module_name, _, function_name = model.partition(":")
    if not module_name or not function_name:
        raise ValueError(f"`model` must be 'package.module:function' (a function that returns the model), "
                         f"got {model!r}.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"`model`={model!r}: cannot import {module_name!r} ({error}); is it installed or on "
                         "PYTHONPATH?") from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"`model`={model!r}: {module_name!r} has no function {function_name!r}.")
    built = function()
    if not isinstance(built, ModelAdapter) and not callable(built):
        raise TypeError(f"`model`={model!r}: {function_name}() must return the model (a callable), "
                        f"got {type(built).__name__}.")
    if device is not None and isinstance(built, torch.nn.Module):
        built = built.to(device)
    return built


def resolve_tokenizer(tokenizer: Any) -> Any:
    """`tokenizer` itself, or `AutoTokenizer.from_pretrained(tokenizer)` for a name or path."""
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer)
    if tokenizer is None or not all(hasattr(tokenizer, name) for name in ("encode", "decode", "eos_token_id")):
        raise TypeError(f"`tokenizer` must be a transformers tokenizer or its name or path, got "
                        f"{type(tokenizer).__name__}.")
    return tokenizer


def _example_model() -> Any:
    return lambda x: 2 * x
