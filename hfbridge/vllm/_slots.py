"""Model Runner V2's request slots as hfbridge sees them: the options per slot, the history from vLLM's buffer.

Model Runner V2 keeps each running request in a persistent slot, recycled through a free list
without a removal call: `add_request(slot, params)` is the only notice, so `Slots.add_request` lets go of
whatever the slot held and sets it up again in full. A step's logits rows are reordered every step;
`ctx.idx_mapping_np` (on the host) maps row `i` to its slot, so the groups are built without reading
anything back from the device. The tokens are vLLM's own: `all_token_ids[slot, :length]`, with
`prompt_len` per slot, and the length so far is `ctx.seq_lens_upper_bound_np`, which vLLM states is
exact without speculative decoding (hfbridge's options are refused under it, below); no history of
hfbridge's is kept. The groups and the chain calls are `_requests.Requests.run`'s, as in the V1
runner.

Rows vLLM does not sample are skipped: a prompt prefilled in chunks gets a logits row at each chunk,
but only the last one's token is kept (`length < prefill_len`: not the last). Under speculative
decoding a request owns one row per draft token, each needing its own prefix: requests with
hfbridge options are refused there (each is ended at its first step and the worker logs why), and
their rows are found with a device mask, as the rows are then no longer one per request.

Nothing here imports vLLM: `state` and `ctx` are anything with the attributes vLLM's
`LogitsProcRequestState` and `LogitsContext` have.

>>> import numpy as np, torch
>>> from types import SimpleNamespace
>>> buffer = SimpleNamespace(gpu=torch.tensor([[0, 0, 0], [3, 3, 0]], dtype=torch.int32))
>>> state = SimpleNamespace(all_token_ids=buffer, prompt_len=SimpleNamespace(np=np.array([0, 2])),
...                         prefill_len=SimpleNamespace(np=np.array([0, 2])), vocab_size=4, device="cpu")
>>> params = SimpleNamespace(extra_args={"hfbridge": {"no_repeat_ngram_size": 2}}, temperature=0.0,
...                          all_stop_token_ids={2}, seed=None)
>>> slots = Slots(state)
>>> slots.add_request(1, params)
True
>>> ctx = SimpleNamespace(idx_mapping_np=np.array([1]), seq_lens_upper_bound_np=np.array([2]))
>>> slots.apply(torch.zeros(1, 4), ctx).tolist()  # [3, 3]: 3 followed 3 once, so not again
[[0.0, 0.0, 0.0, -inf]]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from hfbridge.vllm._requests import Entry, Requests, group_ids

SPECULATIVE = ("hfbridge options cannot run under speculative decoding (each draft token's row would need its own "
               "prefix); the request is ended. Serve it from an engine without `speculative_config`.")


class Slots:
    """The request slots of Model Runner V2 that carry hfbridge options; see the module.

    Args:
        state: vLLM's `LogitsProcRequestState` (read, never written): `all_token_ids.gpu`
            (`(slots, max_model_len)` ids on the device), `prompt_len.np` and `prefill_len.np` (on the
            host), `vocab_size`, `device`.
        seed, tokenizer, default_eos: As `_requests.Requests` takes them.
        refuse: Why requests with hfbridge options cannot run in this engine (speculative decoding), or None.
    """

    def __init__(self, state: Any, *, seed: int = 0, tokenizer: Callable[[], Any] | None = None,
                 default_eos: Iterable[int] = (), refuse: str | None = None):
        self.state = state
        self.refuse = refuse
        self.requests = Requests(vocab_size=state.vocab_size, device=state.device, seed=seed, tokenizer=tokenizer,
                                 default_eos=default_eos)

    def add_request(self, slot: int, params: Any) -> bool:
        """A request enters `slot` (its previous occupant, if any, is let go); whether it has hfbridge options.

        vLLM's runner writes the slot's `prompt_len` on the host before it calls this.
        """
        prompt_length = int(self.state.prompt_len.np[slot])
        return self.requests.add(slot, params, prompt_length, refuse=self.refuse) is not None

    def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Process the rows of requests with hfbridge options of `(rows, vocab)` `logits`, in place."""
        rows = self.requests.rows
        if not rows:
            return logits
        slots = ctx.idx_mapping_np.tolist()  # [num_reqs] batch position -> slot, on the host
        if logits.shape[0] != len(slots):  # speculative decoding: a row per draft token
            return self._end_expanded(logits, ctx, slots)
        lengths = ctx.seq_lens_upper_bound_np  # [num_reqs] tokens so far, on the host
        prefill = self.state.prefill_len.np  # [slots]
        entries = []
        for position, slot in enumerate(slots):
            if slot in rows:
                length = int(lengths[position])
                if length >= prefill[slot]:  # else a prefill chunk before the last: vLLM drops its token
                    entries.append(Entry(position, slot, length))
        if entries:
            self.requests.run(logits, entries, self._ids)
        return logits

    def _ids(self, group: Sequence[Entry], padded: bool) -> torch.Tensor:
        token_ids = self.state.all_token_ids.gpu  # [slots, max_model_len] int32, vLLM's
        histories = [token_ids[entry.key, : entry.length] for entry in group]  # each [T_i]
        return group_ids(histories, padded, self.requests.vocab_size)  # [G, T]

    def _end_expanded(self, logits: torch.Tensor, ctx: Any, slots: Sequence[int]) -> torch.Tensor:
        """End, on every row it owns, each request with options in this step (rows found on the device)."""
        reason = self.refuse or SPECULATIVE
        for slot in dict.fromkeys(slots):
            row = self.requests.rows.get(slot)
            if row is None:
                continue
            if row.failed is None:
                self.requests.fail(slot, reason)
            mine = (ctx.expanded_idx_mapping == slot)[:, None]  # [R, 1] on the device: no read back
            logits.copy_(torch.where(mine, self.requests.ended(logits, row.stop_ids), logits))
        return logits
