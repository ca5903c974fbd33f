"""vLLM's V1 persistent batch as hfbridge sees it: which row holds which request, and its token history.

vLLM's V1 runner keeps its running requests in rows `0..batch_size-1` and tells a logits processor
which rows were removed, added (with the prompt ids and a live list of output ids) and moved before
each step. `Batch` follows those changes with `_requests.Requests` (keyed by the row) and keeps each
request's tokens as a `History`; `apply` hands the rows with hfbridge options, and their histories,
to `Requests.run`, which groups and processes them (the module `_requests` says how).

>>> import torch
>>> from types import SimpleNamespace
>>> params = SimpleNamespace(extra_args={"hfbridge": {"suppress_tokens": [1]}}, temperature=0.0,
...                          all_stop_token_ids={2}, seed=None)
>>> batch = Batch(vocab_size=4)
>>> batch.update(added=[(0, params, [3, 3], [])])
>>> batch.apply(torch.zeros(2, 4)).tolist()
[[0.0, -inf, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from hfbridge.vllm._history import History
from hfbridge.vllm._requests import Entry, Requests, group_ids

Added = tuple[int, Any, "Sequence[int] | None", Sequence[int]]  # (row, SamplingParams, prompt ids, output ids)
Moved = tuple[int, int, bool]  # (from, to, swap)


class Batch:
    """The rows of vLLM's V1 persistent batch that carry hfbridge options; see the module.

    Args:
        vocab_size: The width of vLLM's logits (the model's vocabulary).
        device: Where the logits are (the histories live there too).
        seed, tokenizer, default_eos: As `_requests.Requests` takes them.
    """

    def __init__(self, *, vocab_size: int, device: torch.device | str = "cpu", seed: int = 0,
                 tokenizer: Callable[[], Any] | None = None, default_eos: Iterable[int] = ()):
        self.requests = Requests(vocab_size=vocab_size, device=device, seed=seed, tokenizer=tokenizer,
                                 default_eos=default_eos)

    def __len__(self) -> int:
        return len(self.requests.rows)

    def update(self, removed: Iterable[int] = (), added: Iterable[Added] = (), moved: Iterable[Moved] = ()) -> None:
        """Apply vLLM's batch changes, in vLLM's order: removed, added, moved."""
        for index in removed:
            self.requests.remove(index)
        for index, params, prompt, output in added:
            row = self.requests.add(index, params, None if prompt is None else len(prompt))
            if row is not None:
                row.history = History(prompt or [], output, self.requests.device)
        for source, target, swap in moved:
            self.requests.move(source, target, swap)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Process the rows with hfbridge options of `(rows, vocab)` `logits`, in place; returns `logits`."""
        rows = self.requests.rows
        if not rows:
            return logits
        entries = []
        for index in sorted(rows):
            history = rows[index].history
            history.sync()
            entries.append(Entry(index, index, history.length))
        self.requests.run(logits, entries, self._ids)
        return logits

    def _ids(self, group: Sequence[Entry], padded: bool) -> torch.Tensor:
        histories = [self.requests.rows[entry.key].history.tokens() for entry in group]  # each [T_i]
        return group_ids(histories, padded, self.requests.vocab_size)  # [G, T]
