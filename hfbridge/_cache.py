"""What decoding strategies do to a model's cache, which hfbridge does not own.

Beam search keeps `num_beams` rows per prompt and, after every step, continues each row from one
of the rows of the step before: the model's cache must follow, row for row (`reorder_cache`).
(Assisted and prompt-lookup decoding will add `crop_cache`: drop the last positions.)

Handled here, without any help from the model:
- HF `Cache` objects (`DynamicCache`, ...): their own `reorder_cache`, as HF's beam search calls it;
- nests of tuples / lists / dicts of tensors whose first axis is the batch (the legacy
  `past_key_values` format, most home-grown caches): every tensor is indexed along its first axis;
- `None` (nothing cached yet).
Anything else needs the adapter's hook (`ReturnsCache(model, reorder_cache=...)`,
`InputPos(model, reorder_cache=...)`, `Hooks(..., reorder_cache=...)` or an overridden
`ModelAdapter.reorder_cache`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


class CacheTypeError(TypeError):
    """A cache that hfbridge cannot reorder (or crop) on its own; the message says which hook to use."""


def reorder_cache(cache: Any, beam_idx: torch.Tensor) -> Any:
    """`cache` with its batch rows taken in the order `beam_idx` `(rows,)`.

    A nest is rebuilt (its tensors are never modified); an HF `Cache` reorders itself and is returned.

    Args:
        cache: An HF `Cache`, a nest of tuples / lists / dicts of tensors with the batch first,
            or None.
        beam_idx: `(rows,)` integer index: new row `i` is old row `beam_idx[i]`.

    Raises:
        CacheTypeError: for any other object, or a tensor in the nest whose first axis is not the batch.

    >>> import torch
    >>> layer = (torch.tensor([[1.0], [2.0]]), torch.tensor([[3.0], [4.0]]))   # (keys, values): [B, 1]
    >>> reorder_cache((layer,), torch.tensor([1, 1]))
    ((tensor([[2.],
            [2.]]), tensor([[4.],
            [4.]])),)
    """
    if cache is None:
        return None
    if _is_hf_cache(cache):
        # As HF's own beam search: the Cache object reorders itself. It assigns new tensors to its
        # layers (index_select), so no tensor that was handed out before is changed.
        cache.reorder_cache(beam_idx)
        return cache
    return _reorder_nest(cache, beam_idx, rows=beam_idx.shape[0], path="cache")


def _is_hf_cache(cache: Any) -> bool:
    try:
        from transformers.cache_utils import Cache
    except ImportError:  # pragma: no cover - every supported transformers has it
        return False
    return isinstance(cache, Cache)


def _reorder_nest(value: Any, beam_idx: torch.Tensor, rows: int | None, path: str) -> Any:
    if isinstance(value, torch.Tensor):
        if value.ndim == 0 or (rows is not None and value.shape[0] != rows):
            raise CacheTypeError(
                f"cannot reorder the cache for beam search: {path} is a tensor of shape {tuple(value.shape)}, but "
                f"every tensor in a cache nest must have the batch ({rows if rows is not None else 'rows'}) first. "
                "Pass a reorder_cache= hook to the adapter."
            )
        return value.index_select(0, beam_idx.to(value.device))
    if isinstance(value, (tuple, list)):
        items = [_reorder_nest(item, beam_idx, rows, f"{path}[{i}]") for i, item in enumerate(value)]
        return type(value)(items) if not _is_namedtuple(value) else type(value)(*items)
    if isinstance(value, Mapping):
        return {key: _reorder_nest(item, beam_idx, rows, f"{path}[{key!r}]") for key, item in value.items()}
    if value is None or isinstance(value, (int, float, bool, str)):
        return value  # lengths, flags: the same for every row
    raise CacheTypeError(
        f"cannot reorder a cache of type {type(value).__name__} (at {path}) for beam search: hfbridge reorders "
        "HF Cache objects and tuples / lists / dicts of batch-first tensors. Pass a hook, e.g. "
        "ReturnsCache(model, reorder_cache=lambda cache, beam_idx: ...), or override ModelAdapter.reorder_cache."
    )


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")
