"""Model adapters: how hfbridge calls any model, and how it reorders and crops its cache.

Entry points: `adapters` (`Recompute`, `InputPos`), `returns_cache` (`ReturnsCache`), `choose`
(`as_adapter`), `hooks` (`Hooks`: the caller's own state and hooks), `cache` (`reorder_cache`,
`crop_cache` for HF caches and nests of tensors), `callables` (signature checks and hook results).
Imports: `hfbridge._hf`, torch, transformers.

>>> from hfbridge._models.adapters import Recompute
>>> from hfbridge._models.choose import as_adapter
>>> isinstance(as_adapter(lambda ids: ids), Recompute)
True
"""
