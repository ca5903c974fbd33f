"""The run: one step of a resolved plan, logits in, next tokens out.

`sampler.Sampler` is the step every host runs (`Sampler.step`; `explain` is that step recorded, `record=`);
`sample_step` the same in one call. `Sampler` extends `sampler_setup.SamplerSetup` (what it is built from and how
it reads a step's inputs: a complete base, no stubs) and calls collaborators given what they need: the options
resolved and the chain built (`sampler_chain`), the caller's rows (`sampler_rows.StepInputs`, with
`layout`'s einops patterns), the route decided once (`route`), the checked chain (`processor_list`), the choice
(`sampler_choice`: `exact_draw`'s softmax and multinomial, or the argmax of `cpu_shortcuts`; `per_row_draw` for
per-row groups and generator lists, `grouped_record` for their record), the stateful protocol (`sampler_state`,
`stateful_members`) and a sampler per thinking phase (`phases`). The fused path is `../fast`.

>>> import torch
>>> from hfbridge._step.run.sample_step import sample_step
>>> sample_step(torch.tensor([[0.0, 2.0, 1.0]])).tolist()
[1]
"""
