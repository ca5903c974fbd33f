"""transformers' `Cache` classes: what hfbridge asks of them, by version.

`is_hf_cache` (an instance of `transformers.cache_utils.Cache`), `crop_hf_cache` (`Cache.crop`:
`crop(max_length)` in 4.x, `crop(tokens_to_remove)` with minus the number of positions in 5.x) and
`CacheBase`, the `DynamicCache` the assisted hosts hand to HF's loop (4.x checks
`isinstance(cache, DynamicCache)` before it crops).

>>> import torch
>>> from transformers.cache_utils import DynamicCache
>>> is_hf_cache(DynamicCache()), is_hf_cache((torch.zeros(1),))
(True, False)
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from transformers.cache_utils import Cache, DynamicCache

__all__ = ["CacheBase", "crop_hf_cache", "forgets_past", "is_croppable", "is_hf_cache"]

CacheBase = DynamicCache


def is_hf_cache(cache: Any) -> bool:
    """Whether `cache` is one of transformers' `Cache` objects (which reorder and crop themselves)."""
    return isinstance(cache, Cache)


def is_croppable(cache: Any) -> bool:
    """Whether an HF `Cache` can drop positions (5.x: `is_croppable`, False with recurrent layers; 4.x: has `crop`)."""
    flag = getattr(cache, "is_croppable", None)
    return bool(flag) if flag is not None else callable(getattr(cache, "crop", None))


def forgets_past(cache: Any) -> bool:
    """Whether an HF `Cache` has sliding-window layers that drop what a rollback needs
    (5.x: `record_past` off until `activate_past_recording()`, which HF's assisted loop calls on its cache)."""
    # recurrent (linear-attention) layers cannot roll back at all: `is_croppable` says so, not this
    return any(getattr(layer, "record_past", None) is False and getattr(layer, "is_sliding", False)
               for layer in getattr(cache, "layers", None) or ())


def crop_hf_cache(cache: Any, length: int, cached: int | None = None) -> None:
    """Crop an HF `Cache` in place to `length` positions, whichever `crop` convention it has.

    transformers 4.x's `crop(max_length)` takes the length to keep; 5.x's `crop(tokens_to_remove)`
    takes minus the number of positions to drop (and trims sliding-window layers even for 0).
    `cached`: the positions the model was fed, when known; the cache then loses `cached - length`
    of them, as HF's loop crops it, even where it holds positions of its own besides (CPM-Ant's
    prompt).
    """
    held = int(cache.get_seq_length())
    remove = max((held if cached is None else cached) - length, 0)
    kind: Any = type(cache)
    if "tokens_to_remove" in _crop_parameters(kind):
        cache.crop(-remove)
    elif remove > 0:
        cache.crop(held - remove)


@functools.cache
def _crop_parameters(kind: Any) -> frozenset[str]:
    return frozenset(inspect.signature(kind.crop).parameters)
