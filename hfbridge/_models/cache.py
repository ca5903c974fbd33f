"""What decoding strategies do to a model's cache, which hfbridge does not own.

Beam search keeps `num_beams` rows per prompt and, after every step, continues each row from one
of the rows of the step before: the model's cache must follow, row for row (`reorder_cache`).
Assisted and prompt-lookup decoding feed several draft tokens at once and keep only the ones the
model agrees with: the cache must forget the rejected positions (`crop_cache`).

Handled here, without any help from the model:
- HF `Cache` objects (`DynamicCache`, ...): their own `reorder_cache` and `crop`, as HF's loops
  call them (`crop` in the installed transformers' convention: a length in 4.x, minus the
  number of positions to remove in 5.x);
- nests of tuples / lists / dicts of tensors whose first axis is the batch (the legacy
  `past_key_values` format, most home-grown caches): reordered along the first axis, cropped
  along the second-to-last, the sequence axis of HF's `(batch, heads, seq, head_dim)` and of
  nanoGPT-style `(batch, seq, dim)` caches;
- for cropping, any other object with a `crop(length)` method that keeps the first `length`
  positions of the sequence and returns the cache (the demo model's `KVCache`);
- `None` (nothing cached yet).
Anything else needs the adapter's hook (`ReturnsCache(model, reorder_cache=..., crop_cache=...)`,
`InputPos(model, reorder_cache=...)`, `Hooks(..., reorder_state=..., crop_state=...)` or an
overridden `ModelAdapter.reorder_cache` / `ModelAdapter.crop`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hfbridge._hf.caches import crop_hf_cache, is_croppable, is_hf_cache


class CacheTypeError(TypeError):
    """A cache that hfbridge cannot reorder (or crop) on its own; the message says which hook to use."""


def reorder_cache(cache: Any, beam_idx: torch.Tensor, *, where: str = "cache") -> Any:
    """`cache` with its batch rows taken in the order `beam_idx` `(rows,)`.

    A nest is rebuilt (its tensors are never modified); an HF `Cache` reorders itself and is returned.

    Args:
        cache: An HF `Cache`, a nest of tuples / lists / dicts of tensors with the batch first,
            or None.
        beam_idx: `(rows,)` integer index: new row `i` is old row `beam_idx[i]`.
        where: What `cache` is called in errors. Default: `"cache"`.

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
    if is_hf_cache(cache):
        # As HF's own beam search: the Cache object reorders itself. It assigns new tensors to its
        # layers (index_select), so no tensor that was handed out before is changed.
        cache.reorder_cache(beam_idx)
        return cache
    return _reorder_nest(cache, beam_idx, rows=beam_idx.shape[0], path=where)


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


def crop_cache(cache: Any, length: int, *, cached: int | None = None, where: str = "cache") -> Any:
    """The cache with only its first `length` positions (HF caches are cropped in place).

    Args:
        cache: `None`, an HF `Cache`, a tensor `(..., seq, dim)`, a tuple / list / dict of these, or
            an object with a `crop(length) -> cache` method of its own.
        length: How many positions to keep, `0 <= length`.
        cached: How many positions the cache holds now, when the caller knows it. Every tensor is
            then checked to have that many positions on its sequence axis (the second-to-last),
            so that a cache laid out differently fails loudly instead of being cut on the wrong axis.
        where: What `cache` is called in errors. Default: `"cache"`.

    Returns:
        The cropped cache, of the same structure (tensors are views of the originals).

    Raises:
        CacheTypeError: For a part that is neither of the above, or a tensor whose second-to-last
            axis is not the sequence (by `cached`).

    >>> import torch
    >>> k, v = torch.zeros(2, 4, 7, 8), torch.zeros(2, 4, 7, 8)     # [B, H, T, D]
    >>> [tuple(t.shape) for t in crop_cache(((k, v),), 5, cached=7)[0]]
    [(2, 4, 5, 8), (2, 4, 5, 8)]
    """
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        raise ValueError(f"`length` must be an int >= 0, got {length!r}.")
    return _crop(cache, length, cached, where)


def check_croppable(cache: Any, cached: int, *, where: str = "cache") -> None:
    """Raise `CacheTypeError` now, as `crop_cache` would at the first crop, for a cache it cannot crop.

    Args:
        cache: The cache after a model call.
        cached: How many positions it holds.
        where: What `cache` is called in errors. Default: `"cache"`.

    >>> import torch
    >>> check_croppable((torch.zeros(1, 2, 5, 4),), 5)
    >>> check_croppable({"kv": object()}, 5)
    Traceback (most recent call last):
    ...
    hfbridge._models.cache.CacheTypeError: cannot drop positions from cache['kv'], a object: hfbridge crops HF Cache objects, tensors (..., seq, dim) in tuples/lists/dicts, and objects with a crop(length) method. Give the adapter a crop hook (ReturnsCache(model, crop_cache=...), Hooks(crop_state=...) or an overridden ModelAdapter.crop).
    """  # noqa: E501 (the error line)
    if cache is None:
        return
    if is_hf_cache(cache):
        if not is_croppable(cache):
            _crop(cache, cached, cached, where)  # raises, saying why
        return
    if isinstance(cache, torch.Tensor):
        _crop_tensor(cache, cached, cached, where)
        return
    if _crops_itself(cache):
        return
    if isinstance(cache, dict):
        for key, value in cache.items():
            check_croppable(value, cached, where=f"{where}[{key!r}]")
        return
    if isinstance(cache, (tuple, list)):
        for index, value in enumerate(cache):
            check_croppable(value, cached, where=f"{where}[{index}]")
        return
    _crop(cache, cached, cached, where)  # raises, naming the type


def _crop(item: Any, length: int, cached: int | None, where: str) -> Any:
    if item is None:
        return None
    if is_hf_cache(item):
        if not is_croppable(item):
            raise CacheTypeError(
                f"cannot drop positions from {where}, a {type(item).__name__} that says it is not croppable (it "
                "holds recurrent states, which cannot go back to a shorter prefix). Give the adapter a crop hook "
                "(ReturnsCache(model, crop_cache=...), Hooks(crop_state=...)) that restores a saved state, or do not "
                "use assisted or prompt-lookup decoding, or banned strings, with this model."
            )
        crop_hf_cache(item, length, cached)
        return item
    if isinstance(item, torch.Tensor):
        return _crop_tensor(item, length, cached, where)
    if _crops_itself(item):
        cropped = item.crop(length)
        if cropped is None:
            raise CacheTypeError(f"{where}.crop({length}) returned None; it must return the cropped cache.")
        return cropped
    if isinstance(item, dict):
        return type(item)({key: _crop(value, length, cached, f"{where}[{key!r}]") for key, value in item.items()})
    if isinstance(item, (tuple, list)):
        cropped = [_crop(value, length, cached, f"{where}[{index}]") for index, value in enumerate(item)]
        if isinstance(item, tuple) and hasattr(item, "_fields"):  # a named tuple
            return type(item)(*cropped)
        return type(item)(cropped)
    raise CacheTypeError(
        f"cannot drop positions from {where}, a {type(item).__name__}: hfbridge crops HF Cache objects, "
        "tensors (..., seq, dim) in tuples/lists/dicts, and objects with a crop(length) method. Give the "
        "adapter a crop hook (ReturnsCache(model, crop_cache=...), Hooks(crop_state=...) or an overridden "
        "ModelAdapter.crop)."
    )


def _crops_itself(item: Any) -> bool:
    """An object (not a nest) with a `crop(length)` method of its own, as the demo model's `KVCache`."""
    return not isinstance(item, (dict, tuple, list)) and callable(getattr(item, "crop", None))


def _crop_tensor(tensor: torch.Tensor, length: int, cached: int | None, where: str) -> torch.Tensor:
    if tensor.ndim < 3 or (cached is not None and tensor.shape[-2] != cached):
        held = "" if cached is None else f", while the model has seen {cached} positions"
        raise CacheTypeError(
            f"cannot drop positions from {where}, a tensor of shape {tuple(tensor.shape)}: hfbridge takes the "
            f"second-to-last axis of a cache tensor as the sequence (HF's (batch, heads, seq, head_dim), or "
            f"(batch, seq, dim)){held}. Give the adapter a crop hook (ReturnsCache(model, crop_cache=...), "
            "Hooks(crop_state=...) or an overridden ModelAdapter.crop)."
        )
    if tensor.shape[-2] <= length:
        return tensor
    return tensor[..., :length, :]


def not_growing(old: Any, new: Any, added: int, where: str = "cache") -> str | None:
    """The first tensor of a cache nest whose second-to-last axis did not grow by the `added` positions fed
    between two calls (`old` -> `new`), as `where[...] (shape before -> after)`; None when every one did.

    `crop_cache` cuts that axis; a recurrent state whose size there merely equals the positions seen
    would be cut on the wrong axis. HF `Cache` objects and nests of another structure are not judged
    here (None).

    >>> import torch
    >>> not_growing((torch.zeros(1, 3, 4),), (torch.zeros(1, 4, 4),), added=1) is None
    True
    >>> not_growing((torch.zeros(1, 3, 3),), (torch.zeros(1, 3, 3),), added=1)
    'cache[0] (shape (1, 3, 3) -> (1, 3, 3))'
    """
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        if old.ndim >= 3 and new.ndim == old.ndim and new.shape[-2] != old.shape[-2] + added:
            return f"{where} (shape {tuple(old.shape)} -> {tuple(new.shape)})"
        return None
    if isinstance(old, (tuple, list)) and isinstance(new, (tuple, list)) and len(old) == len(new):
        for index, (a, b) in enumerate(zip(old, new)):
            found = not_growing(a, b, added, f"{where}[{index}]")
            if found is not None:
                return found
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in old:
            if key in new:
                found = not_growing(old[key], new[key], added, f"{where}[{key!r}]")
                if found is not None:
                    return found
    return None
