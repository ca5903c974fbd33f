"""Samplers that transformers lacks, as `transformers.LogitsProcessor`s.

Each class here works in hfbridge's `sample_step`, `Sampler` and `generate`, and in transformers'
own `model.generate(logits_processor=[...])`. Imports: torch and transformers only.

>>> import hfbridge.processors
>>> isinstance(hfbridge.processors.__all__, list)
True
"""

__all__: list[str] = []
