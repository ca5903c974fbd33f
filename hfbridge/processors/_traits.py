"""Traits: what a processor class declares about itself, so the step reads it instead of a table of names.

A trait is a class attribute, declared in the class's own body:

- `keeps_ids_intact` (default: absent, False): `__call__` reads `input_ids` without writing them, keeping a
  reference to them or handing them to user code, so the step may pass the caller's ids without a private copy
  (`hfbridge._step.checks.caller_inputs.keeps_ids_intact`).
- `sampler_name` (default: absent, None): llama.cpp's name for the sampler whose work it does (`sampler_order`'s
  names: `"dry"`, `"xtc"`, ...), so `sampler_order` moves it; without one it keeps its place whatever the order.
- `picks_token` (default: absent, False): it chooses the final token from a distribution of its own (llama.cpp's
  mirostat and adaptive-p), so a chain holds at most one such sampler (`hfbridge._step.plan.community_options.build`).
- `replaces_chain` (default: absent, False): llama.cpp runs it instead of its sampler chain (mirostat), so
  `sampler_order` cannot apply with it.
- `reads_ids` (default: absent, True): False when `__call__` never reads `input_ids` (neither their values
  nor their length), so a host may pass ids of any length: a serving engine's processor then skips building
  the requests' histories and the padding they need (`hfbridge._step.checks.caller_inputs.reads_ids`).

They are read from the class's own `__dict__` (`own_trait`), never inherited: a subclass that overrides
`__call__` may modify or keep the ids, or be another sampler, so it declares its traits again (or has
none). HF's own classes cannot carry them: their facts sit in the registry rows of the options that build
them (`hfbridge._step.plan.option_table`, `hfbridge._step.plan.hf_option_rows`).

>>> from hfbridge.processors import XTCLogitsWarper
>>> own_trait(XTCLogitsWarper, "sampler_name"), own_trait(XTCLogitsWarper, "keeps_ids_intact")
('xtc', True)
>>> class Mine(XTCLogitsWarper):
...     pass
>>> own_trait(Mine, "sampler_name"), own_trait(Mine, "keeps_ids_intact")
(None, None)
"""

from __future__ import annotations

from typing import Any

__all__ = ["TRAITS", "own_trait"]

TRAITS = ("keeps_ids_intact", "sampler_name", "picks_token", "replaces_chain", "reads_ids")


def own_trait(kind: type, name: str) -> Any:
    """The trait `name` declared in `kind`'s own body (not inherited), or None."""
    return vars(kind).get(name)
