"""The step: logits in, next tokens out, as HF's `generate` would choose them.

Entry points: `sampler.Sampler` (a reusable step), `sample_step.sample_step` (one call), `layout`
(einops patterns between a model's output and rows), `build_processors` (HF's processor list for a
set of options), `option_checks` (every option's check), `community_options` (the options of
`hfbridge.processors`' samplers: one row each, and their place in the chain), `processor_list` (the checked list),
`routes` (CPU/accelerator choices), `fast/` (the fused, sort-free path).
Imports: `hfbridge._hf`, `hfbridge.processors`, torch, transformers; never `_models`, `_generate`, `_views`.

>>> import torch
>>> from hfbridge._step.sample_step import sample_step
>>> sample_step(torch.tensor([[0.0, 2.0, 1.0]])).tolist()
[1]
"""
