"""The step: logits in, next tokens out, as HF's `generate` would choose them.

Entry points: `sampler.Sampler` (a reusable step), `sample_step.sample_step` (one call), `layout`
(einops patterns between a model's output and rows), `build_processors` (HF's processor list for a
set of options), `option_table` (the option registry: one row per sampling option, HF's and the community
samplers'), `option_checks` (every option's check: `check_option_values`), `community_options` (the community
samplers built and placed from their rows), `sampler_order` (llama.cpp's `--samplers` order of the chain),
`processor_list` (the checked list),
`cpu_shortcuts` (CPU/accelerator choices), `caller_inputs` (the logits inside
a model output), `sampler_rows` (a `Sampler` step's first stages: checked rows), `sampler_choice` (its last:
the token chosen, the rows with nothing to choose explained), `guidance_processor`
(`guidance_scale=`'s processor), `phases` / `phase_options` (`thinking_options=`: a sampler per phase),
`fast/` (the fused, sort-free path).
Imports: `hfbridge._hf`, `hfbridge.processors`, torch, transformers; never `_models`, `_generate`, `_views`.

>>> import torch
>>> from hfbridge._step.sample_step import sample_step
>>> sample_step(torch.tensor([[0.0, 2.0, 1.0]])).tolist()
[1]
"""
