"""HF's output classes, filled and read under the installed version's field names.

transformers 5.24 renamed the cache field of its output classes from `past_key_values` to `cache`
(the old name remains as a property that logs a deprecation warning, and passing both names raises).
hfbridge builds and reads these outputs only here, with `names.OUTPUT_CACHE`, after checking once
that the class has the fields it fills (`contracts.check_fields`).

>>> import torch
>>> out = decoder_output(sequences=torch.tensor([[1, 2]]), cache="the model's cache")
>>> cache_of(out)
"the model's cache"
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers.generation.utils import GenerateBeamDecoderOnlyOutput, GenerateDecoderOnlyOutput
from transformers.modeling_outputs import CausalLMOutputWithPast

from hfbridge._hf import names
from hfbridge._hf.contracts import check_fields

__all__ = ["cache_of", "decoder_output", "model_output", "with_cache"]

_DECODER_FIELDS = ("sequences", "scores", "logits", "attentions", "hidden_states")


def decoder_output(*, sequences: torch.Tensor, scores: Any = None, logits: Any = None,
                   cache: Any = None) -> GenerateDecoderOnlyOutput:
    """HF's `GenerateDecoderOnlyOutput` (greedy search and sampling) with the cache under its field name."""
    check_fields(GenerateDecoderOnlyOutput, (*_DECODER_FIELDS, names.OUTPUT_CACHE))
    fields: dict[str, Any] = {"sequences": sequences, "scores": scores, "logits": logits, "attentions": None,
                              "hidden_states": None, names.OUTPUT_CACHE: cache}
    return GenerateDecoderOnlyOutput(**fields)


def model_output(*, logits: torch.Tensor, cache: Any = None) -> CausalLMOutputWithPast:
    """HF's `CausalLMOutputWithPast` (what HF's loops expect from a model call), with the cache if any."""
    if cache is None:
        return CausalLMOutputWithPast(logits=logits)
    check_fields(CausalLMOutputWithPast, ("logits", names.OUTPUT_CACHE))
    return CausalLMOutputWithPast(**{"logits": logits, names.OUTPUT_CACHE: cache})


def with_cache(output: Any, cache: Any) -> Any:
    """A copy of HF's generate output `output` whose cache is `cache` (the user's, in place of the host's)."""
    kind = type(output)
    if kind in (GenerateDecoderOnlyOutput, GenerateBeamDecoderOnlyOutput) or dataclasses.is_dataclass(output):
        check_fields(kind, (names.OUTPUT_CACHE,))
        values = {field.name: getattr(output, field.name) for field in dataclasses.fields(output)}
        values[names.OUTPUT_CACHE] = cache
        return kind(**values)
    raise TypeError(f"expected one of HF's generate output classes, got {kind.__name__}")


def cache_of(output: Any) -> Any:
    """The cache held by HF's output `output` (a model's or `generate`'s), read under the installed field name."""
    check_fields(type(output), (names.OUTPUT_CACHE,))
    return getattr(output, names.OUTPUT_CACHE)
