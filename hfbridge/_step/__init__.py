"""The step: logits in, next tokens out, as HF's `generate` would choose them.

Four rooms: `plan/` (the option registry and a call resolved into its chain), `run/` (the one step every host
runs: `run.sampler.Sampler`, `run.sample_step.sample_step`), `fast/` (the fused, sort-free path) and `checks/`
(every value checked once, errors naming it).
Imports: `hfbridge._hf`, `hfbridge.processors`, torch, transformers; never `_models`, `_generate`, `_views`.

>>> import torch
>>> from hfbridge._step.run.sample_step import sample_step
>>> sample_step(torch.tensor([[0.0, 2.0, 1.0]])).tolist()
[1]
"""
