"""Top-p (nucleus) on the fast path: one module per route.

`route_table` (the route table: which route runs, returning a plan), `mask` (the exact float32 mask,
HF's cut), `sorted_mask` (one sort, for rows that keep many), `draw_then_check` (draw, then check the token,
when many survive), `floor_candidates` (the candidates above last step's floor), `compiled` (the
fixed-shape route for `torch.compile` and accelerators).
Imports: `hfbridge._step.fast` helpers, torch, numpy.

>>> import torch
>>> from hfbridge._step.fast.top_p.mask import top_p_mask
>>> top_p_mask(torch.tensor([[0.6, 0.1, 0.3]]), 0.5).tolist()
[[True, False, False]]
"""
