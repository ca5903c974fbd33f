"""The fast path: the step's processors fused, without sorting the vocabulary.

Entry points: `fast_path.fast_sample` / `fast_draw` / `fast_scores`; `state.FastState` (what one
Sampler remembers between steps); `draw` (drawing from kept tokens); `candidates` (the best tokens
of each row by block maxima); `one_row` (batch 1); `top_p/` (the top-p routes: exact mask, sorted
mask, candidate draw, the compiled fixed-shape route).
Imports: `hfbridge._step`'s helpers below it (routes, processor_list), torch, numpy.

>>> import torch
>>> from transformers import TopKLogitsWarper
>>> from hfbridge._step.fast.fast_path import fast_scores
>>> fast_scores(None, torch.tensor([[1.0, 3.0, 2.0]]), [TopKLogitsWarper(1)])
tensor([[-inf, 3., -inf]])
"""
