"""The fast path: the step's processors fused, without sorting the vocabulary.

Entry points: `fast_path.fast_sample` / `fast_draw` / `fast_scores`; `state.FastState` (the scores
between processors) with `pending` (what the last filter decided, one tagged value); `weighted_draw`
(drawing from kept tokens); `candidates` (the best tokens of each row by block maxima); `one_row`
(batch 1); `workspace` (the vocabulary-sized buffers a `Sampler` lends its steps on CPU); `top_p/` (the
top-p routes, and `top_p/route_table.py`, the one table that chooses them).
Imports: `hfbridge._step`'s helpers below it (cpu_shortcuts, processor_list), torch, numpy.

>>> import torch
>>> from transformers import TopKLogitsWarper
>>> from hfbridge._step.fast.fast_path import fast_scores
>>> fast_scores(None, torch.tensor([[1.0, 3.0, 2.0]]), [TopKLogitsWarper(1)])
tensor([[-inf, 3., -inf]])
"""
