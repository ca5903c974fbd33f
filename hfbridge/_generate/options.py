"""`generate`'s keyword arguments as one object, passed down instead of being listed again.

`generate` takes them as keywords (its signature is the documentation); `prepare`, the strategy
runners and the HF-loop hosts receive one `GenerateOptions`. Its fields are exactly `generate`'s
keyword parameters, plus `kwargs` (generation options and model inputs): a test checks both ways,
and `args.py`'s did-you-mean hints read the names from here.

A new keyword of `generate`: the parameter (in the implementation and its three overloads, with
its docstring entry), one field here, and its check where it is read.

>>> options = GenerateOptions(fast=True, kwargs={"top_k": 5})
>>> options.fast, options.streamer, options.kwargs
(True, None, {'top_k': 5})
>>> "check_every" in option_names()
True
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["GenerateOptions", "option_names"]


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """`generate`'s keyword arguments as the caller passed them (checked by `prepare`, not here).

    See `hfbridge.generate` for what each one means; the defaults are `generate`'s.
    """

    attention_mask: Any = None  # [B, T] or None
    generation_config: Any = None
    processors: Any = None
    stopping_criteria: Any = None
    streamer: Any = None
    tokenizer: Any = None
    layout: Any = None
    vocab_size: Any = None
    generator: Any = None
    progress: Any = False
    fast: Any = False
    max_context: Any = None
    prefix_allowed_tokens_fn: Any = None
    assistant_model: Any = None
    check_every: Any = 1
    synced_gpus: Any = None
    thinking_options: Any = None
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)  # GenerationConfig options, model inputs


def option_names() -> tuple[str, ...]:
    """`generate`'s own keyword parameters, in order (`kwargs` excluded)."""
    return tuple(field.name for field in dataclasses.fields(GenerateOptions) if field.name != "kwargs")
