"""A step's inputs as the caller hands them: the logits inside a model output, and which
processors leave the token ids as they found them.

>>> extract_logits({"logits": torch.zeros(1, 3)}).shape
torch.Size([1, 3])
>>> from transformers import TemperatureLogitsWarper
>>> keeps_ids_intact([TemperatureLogitsWarper(0.7)]), keeps_ids_intact([lambda ids, scores: scores])
(True, False)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from hfbridge.processors._traits import own_trait

__all__ = ["check_not_meta", "extract_logits", "keeps_ids_intact", "reads_ids"]


def extract_logits(output: Any) -> torch.Tensor:
    """The logits tensor inside a model output: a tensor, a tuple/list (first item), a mapping with
    `"logits"` or an object with a `.logits` attribute (HF's `ModelOutput`).

    >>> extract_logits((torch.zeros(1, 3), "cache")).shape
    torch.Size([1, 3])
    """
    logits = output
    if not isinstance(logits, torch.Tensor):
        if isinstance(output, Mapping):
            if "logits" not in output:
                raise TypeError(
                    f"`logits` is a mapping without a 'logits' key (keys: {list(output)[:8]}); "
                    "pass the logits tensor or an output holding it under 'logits'."
                )
            logits = output["logits"]
        elif hasattr(output, "logits"):
            logits = output.logits
        elif isinstance(output, (tuple, list)):
            if not output:
                raise TypeError("`logits` is an empty tuple/list; expected the logits as its first element.")
            logits = output[0]
    if not isinstance(logits, torch.Tensor):
        raise TypeError(
            "`logits` must be a tensor, a tuple/list whose first element is one, a mapping with 'logits' "
            f"or an object with `.logits`; got {type(output).__name__}"
            + (f" holding {type(logits).__name__}" if logits is not output else "") + "."
        )
    if not logits.is_floating_point():
        raise TypeError(f"`logits` must be a floating-point tensor, got dtype {logits.dtype}.")
    return logits


def check_not_meta(logits: torch.Tensor) -> None:
    """Raise `ValueError` for logits on the meta device (a shape without values)."""
    if logits.is_meta:
        raise ValueError(
            f"`logits` of shape {tuple(logits.shape)} are on the meta device: they have a shape but no values, so "
            "there is nothing to choose from. Run the model on a real device (load or materialize its weights "
            "first, e.g. `model.to_empty(device=...)` then load the state dict)."
        )


def _hf_types(names: Iterable[str]) -> frozenset[type]:
    """HF's processor classes of these names (those the installed transformers has)."""
    from transformers.generation import logits_process

    found = [getattr(logits_process, name, None) for name in names]
    return frozenset(kind for kind in found if isinstance(kind, type))


@functools.cache
def _hf_intact_types() -> frozenset[type]:
    """HF's processor classes the registry's rows mark `keeps_ids_intact` (they rebind, never modify, the ids;
    not `PrefixConstrainedLogitsProcessor`: it calls the user's function with the ids)."""
    from hfbridge._step.plan.hf_option_rows import intact_processors

    return _hf_types(intact_processors())


@functools.cache
def _hf_idless_types() -> frozenset[type]:
    """HF's processor classes the registry's rows say never read the ids (`reads_ids`: HF's warpers)."""
    from hfbridge._step.plan.option_table import idless_processors

    return _hf_types(idless_processors())


def reads_ids(processors: Iterable[Any]) -> bool:
    """Whether any of `processors` may read the token ids (their values or their length): False only when each
    is exactly one of HF's classes the registry says never reads them, or a class that declares `reads_ids =
    False` in its own body (`hfbridge/processors/_traits.py`), so a host may skip building the ids.

    >>> from transformers import TopKLogitsWarper
    >>> from hfbridge.processors import DRYLogitsProcessor, XTCLogitsWarper
    >>> reads_ids([TopKLogitsWarper(5), XTCLogitsWarper(0.1, 0.5)])
    False
    >>> reads_ids([DRYLogitsProcessor(0.8, sequence_breakers=[[3]])])
    True
    """
    idless = _hf_idless_types()
    return not all(type(processor) in idless or own_trait(type(processor), "reads_ids") is False
                   for processor in processors)


def keeps_ids_intact(processors: Iterable[Any]) -> bool:
    """Whether none of `processors` can modify the token ids it is given or keep them: each is exactly one
    of HF's option-built classes the registry marks so, or a class that declares the trait `keeps_ids_intact`
    in its own body (`hfbridge/processors/_traits.py`; a subclass may override `__call__`, so it is not
    inherited), so the step may pass the caller's ids without a private copy."""
    intact = _hf_intact_types()
    return all(type(processor) in intact or own_trait(type(processor), "keeps_ids_intact") is True
               for processor in processors)
