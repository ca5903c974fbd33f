"""What transformers' `model.generate(custom_generate=...)` hands a decoding function, per release.

Read from transformers' `GenerationMixin.generate` (4.52 to 5.24):

- **A callable** (4.56+): `generate` prepares the inputs as usual (the merged `GenerationConfig`
  with `max_length` set, the mask, position ids, an empty cache, `logits_to_keep`), builds its
  processors and stopping criteria, then calls `fn(model, input_ids, logits_processor=...,
  stopping_criteria=..., generation_config=..., **model_kwargs)`. From 4.57 on, the keywords of
  `generate` that `fn`'s signature names and `GenerationMixin._sample`'s does not are popped before
  the config is built and passed to `fn` (`CALLABLE_KEYWORDS_SINCE`); `tokenizer`,
  `assistant_tokenizer`, `streamer`, `assistant_model` and `synced_gpus` are not passed. 4.56
  passes `synced_gpus` and `streamer`, and no keyword of `fn`'s own (an unknown keyword is an unused
  model input there, which `generate` refuses).
- **A folder** (`custom_generate="path"`, 4.52+; 5.24 asks `trust_remote_code=True` for a local
  folder too): `path/custom_generate/generate.py`'s `generate(model=..., **arguments)` is
  called with every argument of `generate` as given (`inputs`, `tokenizer`, `streamer`, ...), nothing
  prepared.

>>> CALLABLE_KEYWORDS_SINCE
(4, 57, 0)
>>> sorted(PREPARED_INPUTS)[:3]
['cache', 'cache_params', 'cache_position']
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers.generation.utils import GenerationMixin

from hfbridge._hf.stand_in import ProcessorHost

__all__ = ["CALLABLE_KEYWORDS_SINCE", "FOLDER_ARGUMENTS", "PREPARED_INPUTS", "built", "cache_length", "same_settings",
           "sample_parameters"]

CALLABLE_KEYWORDS_SINCE = (4, 57, 0)
# The model inputs `generate` prepares and advances itself; the callable receives them in `model_kwargs`.
PREPARED_INPUTS = frozenset({"position_ids", "cache_position", "logits_to_keep", "num_logits_to_keep", "use_cache",
                             "past_key_values", "cache", "cache_params"})
# The named parameters of `generate` that the folder form passes (None when the caller left them out).
FOLDER_ARGUMENTS = ("inputs", "generation_config", "logits_processor", "stopping_criteria",
                    "prefix_allowed_tokens_fn", "synced_gpus", "assistant_model", "streamer", "negative_prompt_ids",
                    "negative_prompt_attention_mask", "use_model_defaults")


def sample_parameters() -> frozenset[str]:
    """The parameters of `GenerationMixin._sample`: a callable's parameters of these names get no keyword."""
    return frozenset(inspect.signature(GenerationMixin._sample).parameters)


def built(generation_config: Any, *, prompt_length: int, device: Any) -> tuple[list[Any], list[Any]]:
    """The processors and stopping criteria `generate` builds from this config alone (HF's
    `_get_logits_processor` and `_get_stopping_criteria` on a stand-in host)."""
    from transformers import LogitsProcessorList, StoppingCriteriaList

    host = ProcessorHost(device=device)
    processors = host.logits_processor(generation_config, prompt_length=prompt_length,
                                       processors=LogitsProcessorList(), device=device, attention_mask=None)
    criteria = host.stopping_criteria(generation_config, StoppingCriteriaList(), tokenizer=None)
    return list(processors), list(criteria)


def same_settings(one: Any, other: Any) -> bool:
    """Whether two processors (or criteria) of one class hold the same settings (their attributes)."""
    first, second = vars(one), vars(other)
    if first.keys() != second.keys():
        return False
    for name, value in first.items():
        theirs = second[name]
        if isinstance(value, torch.Tensor) or isinstance(theirs, torch.Tensor):
            if not (isinstance(value, torch.Tensor) and isinstance(theirs, torch.Tensor)
                    and value.shape == theirs.shape and torch.equal(value.cpu(), theirs.cpu())):
                return False
        elif not _plain_equal(value, theirs):
            return False
    return True


def _plain_equal(value: Any, theirs: Any) -> bool:
    try:
        return bool(value == theirs)
    except Exception:  # values that cannot say (arrays, objects without __eq__): not the same
        return value is theirs


def cache_length(cache: Any) -> int:
    """Positions a cache `generate` passed holds (0: the empty one it prepared)."""
    if cache is None:
        return 0
    length = getattr(cache, "get_seq_length", None)
    return int(length()) if callable(length) else 1
