"""The run: one step of a resolved plan, logits in, next tokens out.

`sampler.Sampler` is the step every host runs (`Sampler.step`); `sample_step` the same in one call. Its stages:
the caller's rows (`sampler_rows`, with `layout`'s einops patterns), the route decided once (`route`), the
checked chain (`processor_list`), the choice (`sampler_choice`: `exact_draw`'s softmax and multinomial, or the
argmax of `cpu_shortcuts`; `per_row_draw` for per-row groups and generator lists), the stateful protocol
(`sampler_state`, `stateful_members`) and a sampler per thinking phase (`phases`). The fused path is `../fast`.

>>> import torch
>>> from hfbridge._step.run.sample_step import sample_step
>>> sample_step(torch.tensor([[0.0, 2.0, 1.0]])).tolist()
[1]
"""
