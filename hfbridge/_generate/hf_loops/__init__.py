"""Hosts on which transformers' own beam and assisted loops run for any model.

Entry points: `host.LoopHost` (a `GenerationMixin` whose forward is the model adapter), `beam`
(`_beam_search` through the host), `assisted` / `assisted_stand_ins` (`_assisted_decoding`, the target
and draft hosts, prompt lookup).
Imports: `hfbridge._step`, `hfbridge._models`, `hfbridge._hf`, the loop helpers of `hfbridge._generate`.

>>> from hfbridge._generate.hf_loops.beam import check_beam_options
>>> callable(check_beam_options)
True
"""
