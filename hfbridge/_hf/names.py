"""Names and conventions of transformers that changed between releases, for the installed version.

Everything here is decided once, at import, from the installed version; the rest of hfbridge reads
these attributes (through the module, `names.LOOP_CACHE`, so that tests can simulate a rename with
`monkeypatch.setattr`). Whether the installed code really behaves as these names say is checked at
run time by `hfbridge._hf.contracts`.

>>> from hfbridge._hf import names
>>> names.LOOP_CACHE == ("cache" if names.TRANSFORMERS_VERSION >= names.CACHE_RENAMED_IN else "past_key_values")
True
>>> names.crop_keeps(fed=7, amount=-2) if names.CROP_TAKES_REMOVED else names.crop_keeps(fed=7, amount=5)
5
"""

from __future__ import annotations

import inspect
import re

import transformers
from transformers.cache_utils import DynamicCache

__all__ = ["ALL_CACHE_NAMES", "CACHE_RENAMED_IN", "CROP_TAKES_REMOVED", "LOOP_CACHE", "OUTPUT_CACHE",
           "TRANSFORMERS_MAJOR", "TRANSFORMERS_VERSION", "TRANSFORMERS_VERSION_TEXT", "crop_keeps", "parse_version"]


def parse_version(text: str) -> tuple[int, int, int]:
    """`"5.24.0"` -> `(5, 24, 0)`; pre-release and local parts are ignored (`"4.57.0.dev0"` -> `(4, 57, 0)`).

    >>> parse_version("4.57.0.dev0"), parse_version("5.0.0rc1")
    ((4, 57, 0), (5, 0, 0))
    """
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if found is None:
        raise ValueError(f"cannot read the transformers version {text!r}; expected e.g. '5.24.0'.")
    return int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)


TRANSFORMERS_VERSION_TEXT: str = transformers.__version__
TRANSFORMERS_VERSION: tuple[int, int, int] = parse_version(TRANSFORMERS_VERSION_TEXT)
TRANSFORMERS_MAJOR: int = TRANSFORMERS_VERSION[0]

# transformers 5.24 renamed the cache from `past_key_values` to `cache`: in `model_kwargs` of its
# loops, as the keyword of `prepare_inputs_for_generation` and of the assistant's `generate`, and
# as the field of its output classes (`CausalLMOutputWithPast`, `Generate*Output`), whose old name
# is kept as a property that logs a deprecation warning.
CACHE_RENAMED_IN = (5, 24)
_RENAMED = TRANSFORMERS_VERSION >= CACHE_RENAMED_IN
LOOP_CACHE: str = "cache" if _RENAMED else "past_key_values"
"""The key of the cache in HF's loops' `model_kwargs` and the keyword HF passes it by."""
OUTPUT_CACHE: str = "cache" if _RENAMED else "past_key_values"
"""The field of HF's model and generate output classes that holds the cache."""
ALL_CACHE_NAMES: tuple[str, ...] = ("past_key_values", "cache")
"""Every name HF's own models have used for the cache (a `Hooks` state may hold it under either)."""

# `Cache.crop`: up to 5.16 it takes a length to keep (`crop(max_length)`, negative meaning "all but
# the last n"; HF's assisted loop passes a length up to 5.13, `-n` from 5.14); since 5.17 it takes
# minus the number of positions to remove (`crop(tokens_to_remove)`, `crop(-n)`, n >= 0). Read from
# the installed `DynamicCache.crop`, whose parameter was renamed with the change.
CROP_TAKES_REMOVED: bool = "tokens_to_remove" in inspect.signature(DynamicCache.crop).parameters


def crop_keeps(fed: int, amount: int) -> int:
    """How many positions a cache that holds `fed` keeps after HF calls `crop(amount)` on it (>= 0)."""
    if CROP_TAKES_REMOVED:
        return max(fed + amount, 0)
    return max(amount if amount >= 0 else fed + amount, 0)
