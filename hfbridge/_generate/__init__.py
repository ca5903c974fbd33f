"""`generate`: the whole loop, HF's semantics, for any model.

Entry points: `generate.generate` (the call), `options` (its keywords as one object), `args` (their
checks), `call` (the call's preparation), `prepared` (the prepared `Call`), `modes` (which mode a
config selects, a row of the table), `strategies` (the table: mode -> its row, runner and checks),
`stateful_calls` (reset, reorder, rollback of stateful processors), `loop` (the one-token loop),
`finished` (finished rows, one host read a step), `lockstep` (`synced_gpus`), `output` (HF's
output objects), `transition_scores`, `banned` / `banned_text` / `banned_loop` (banned strings rolled
back: `BannedStrings`, the text checks, the loop's hook); `hf_loops/` hosts HF's own beam and assisted loops.
Imports: `hfbridge._step`, `hfbridge._models`, `hfbridge._hf`; never `_views`.

>>> import torch
>>> from hfbridge._generate.generate import generate
>>> generate(lambda ids: torch.nn.functional.one_hot(ids % 3, 3).float(), torch.tensor([[0]]),
...          max_new_tokens=3).tolist()
[[0, 0, 0, 0]]
"""
