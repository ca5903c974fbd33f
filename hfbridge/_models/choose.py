"""`as_adapter`: the adapter a model gets when the caller passes the model itself.

A `ModelAdapter` is used as it is; a transformers `PreTrainedModel` gets `HFModel` (its own cache and
input preparation, as its `generate` feeds it); any other callable gets `Recompute` (the whole
sequence every step). It sits above `adapters` and `hf_model`, which both define adapters.

>>> import torch
>>> type(as_adapter(lambda ids: torch.zeros(*ids.shape, 3))).__name__
'Recompute'
"""

from __future__ import annotations

from typing import Any

from hfbridge._models.adapters import ModelAdapter, Recompute
from hfbridge._models.hf_model import HFModel, is_hf_model


def as_adapter(model: Any, *, max_context: int | None = None) -> ModelAdapter:
    """`model` if it is an adapter already; `HFModel(model)` for a transformers `PreTrainedModel`
    (without `max_context`); else `Recompute(model, max_context=max_context)`."""
    if isinstance(model, ModelAdapter):
        if max_context is not None:
            if not isinstance(model, Recompute):
                raise TypeError(
                    f"`max_context` applies to plain callables (Recompute), but `model` is a {type(model).__name__}."
                )
            if model.max_context is not None and model.max_context != max_context:
                raise ValueError(
                    f"`max_context`={max_context} disagrees with the Recompute adapter's "
                    f"max_context={model.max_context}."
                )
            return Recompute(model.model, max_context=max_context)
        return model
    if max_context is None and is_hf_model(model):
        return HFModel(model)
    return Recompute(model, max_context=max_context)
