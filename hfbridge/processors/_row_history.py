"""One state per row and per sequence length, for the stateful samplers (mirostat 1, adaptive-p, a thinking budget).

A stateful sampler's state after `n` tokens, `S(n)`, depends only on those tokens. `RowHistory`
keeps, for each row, the tokens of the last call (`ids`, `(rows, P)`) and the state each length up
to `P` had (`states`, `(rows, P + 1, K)`, with `known` marking the lengths seen). A call with
`input_ids` of length `L` finds, for each row, a row of the history it continues:

- a **repeat**: the history row holds the same first `L` tokens and knows `S(L)`: the state is
  `S(L)` as it was (a step taken again after a rewind, or a second `generate` from the same prompt);
- a **continuation**: it holds the same first `L - 1` tokens and knows `S(L - 1)`: the sampler
  updates that state with token `L` (plain decoding; `last_only=True` restricts it to the last
  call's length, for samplers whose update needs that call's distribution);
- neither: the row starts fresh.

Rows are matched across the batch, so transformers' beam search (which reorders rows without telling
the processors) is followed too: among the rows with the right tokens, the same row first (where a
loop's `reorder` put the row's own history), then a row with the same per-row values (the `RowParam`s
given to `RowHistory`). Two rows with the same tokens and the same values have the same state, so the
choice among them does not matter; the beams of two identical prompts with other values are told
apart by their values. `reorder`, `rollback` and `reset` are the stateful protocol's calls
(`_stateful.py`); all of it runs on the device, with no host read (on the CPU, where a read is free,
the plain step, every row continuing its own, is recognised with two).

>>> history = RowHistory()
>>> ids = torch.tensor([[1, 2], [3, 4]])
>>> found = history.lookup(ids)
>>> found.repeat.tolist(), found.previous.tolist()
([False, False], [False, False])
>>> history.record(ids, found, torch.tensor([[10.0], [20.0]]))
>>> found = history.lookup(torch.tensor([[3, 4, 7], [1, 2, 9]]))    # rows swapped, one token longer
>>> found.previous.tolist(), found.source.tolist(), found.before[:, 0].tolist()
([True, True], [1, 0], [20.0, 10.0])
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hfbridge.processors._cpu_side import host_path
from hfbridge.processors._rows import RowParam

__all__ = ["Found", "RowHistory"]


class Found(NamedTuple):
    """What `RowHistory.lookup` found for each row of a call of length `L` (all `(rows,)` or `(rows, K)`)."""

    source: torch.Tensor  # [B] long: the history row it continues (0 when none)
    repeat: torch.Tensor  # [B] bool: S(L) is known
    previous: torch.Tensor  # [B] bool: not a repeat, and S(L - 1) is known
    at: torch.Tensor  # [B, K] S(L) where `repeat` (else anything)
    before: torch.Tensor  # [B, K] S(L - 1) where `previous` (else anything)
    own: bool = False  # known on the host: every row continues its own row of the last call


class RowHistory:
    """The tokens and per-length states of the rows a stateful sampler has seen (see the module).

    Args:
        *params: The sampler's parameters whose per-row values a row's state depends on (mirostat's
            `tau` and `eta`, ...): a row continues a row with its own values before any other.
    """

    def __init__(self, *params: RowParam) -> None:
        self.params = params
        self._kinds: dict[tuple[int, torch.device], torch.Tensor | None] = {}
        self.reset()

    def reset(self) -> None:
        """Forget every row."""
        self._follow: torch.Tensor | None = None  # [B] long: the next lookup's rows, as the caller said (`follow`)
        self.ids: torch.Tensor | None = None  # [B, P] the last call's tokens (-1 after a rollback's cut)
        self.states: torch.Tensor | None = None  # [B, P + 1, K] S(n) for n = 0..P
        self.known: torch.Tensor | None = None  # [B, P + 1] bool
        self.kinds: torch.Tensor | None = None  # [B] long: rows of one kind have the same per-row values

    def kinds_for(self, rows: int, device: torch.device) -> torch.Tensor | None:
        """`(rows,)` long, equal for rows whose per-row values are all equal; None when every row has the same.

        Made once per (rows, device) from the host values: no device read.
        """
        key = (rows, device)
        if key not in self._kinds:
            per_row = [param.for_rows(rows) for param in self.params if not param.scalar]
            values = list(zip(*per_row)) if per_row else []
            kinds = {value: kind for kind, value in enumerate(dict.fromkeys(values))}
            self._kinds[key] = None if len(kinds) <= 1 else torch.tensor([kinds[value] for value in values],
                                                                           device=device)
        return self._kinds[key]

    def follow(self, source: torch.Tensor) -> None:
        """At the next `lookup` only: row `i` continues row `source[i]` of the last call (-1: a new sequence), by
        the caller's word instead of by its tokens, whose last one is the token chosen since (an engine that
        knows its requests: `hfbridge/vllm/_requests.py`). No device read."""
        self._follow = source

    @property
    def length(self) -> int | None:
        """`P`, the last call's sequence length (None before the first call)."""
        return None if self.ids is None else self.ids.shape[1]

    def lookup(self, input_ids: torch.Tensor, *, width: int = 1, dtype: torch.dtype = torch.float32,
               last_only: bool = False) -> Found:
        """For each row of `input_ids` `(rows, L)`: the history row it repeats or continues (see the module)."""
        rows, length = input_ids.shape
        device = input_ids.device
        ids, states, known = self.ids, self.states, self.known
        none = torch.zeros(rows, dtype=torch.bool, device=device)
        blank = torch.zeros(rows, width, dtype=dtype, device=device)
        follow, self._follow = self._follow, None
        if ids is None or states is None or known is None or ids.device != device or states.shape[-1] != width:
            return Found(torch.zeros(rows, dtype=torch.long, device=device), none, none, blank, blank)
        if follow is not None:  # the caller says which row each continues: the last call's state at its length
            source = follow.to(device=device, dtype=torch.long)  # [B]
            named = (source >= 0) & (source < ids.shape[0])
            source = torch.where(named, source, 0)
            previous = named & known[source, ids.shape[1]]
            return Found(source, none, previous, blank, states[source, ids.shape[1]].to(dtype))
        past = ids.shape[1]
        if length == 0 or length - 1 > past:
            return Found(torch.zeros(rows, dtype=torch.long, device=device), none, none, blank, blank)
        if length - 1 == past and ids.shape[0] == rows and host_path(input_ids, ids) \
                and bool(known[:, past].all()) and torch.equal(input_ids[:, :past], ids):
            # the plain step, every row continuing its own row of the last call: the general path's answer
            # from two host reads (free on the CPU) instead of its comparisons across the batch
            before = states[:, past].to(dtype)  # [B, K]
            return Found(torch.arange(rows, device=device), none, ~none, before, before, own=True)
        # [B, B'] the first L - 1 tokens agree (L - 1 <= P)
        same = (input_ids[:, None, :length - 1] == ids[None, :, :length - 1]).all(-1)
        # [B, B'] the same row first (a loop's `reorder` put it there), then a row with the same per-row values
        prefer = 1.0 + 4.0 * (torch.arange(rows, device=device)[:, None] == torch.arange(ids.shape[0], device=device))
        kinds = self.kinds_for(rows, device)
        if kinds is not None and self.kinds is not None and self.kinds.shape[0] == ids.shape[0]:
            prefer = prefer + 2.0 * (kinds[:, None] == self.kinds[None, :])
        previous_ok = same & known[None, :, length - 1]
        if last_only and length - 1 != past:
            previous_ok = torch.zeros_like(previous_ok)
        if length <= past:  # a repeat needs the L-th token too
            repeat_ok = same & (input_ids[:, None, length - 1] == ids[None, :, length - 1]) & known[None, :, length]
        else:
            repeat_ok = torch.zeros_like(same)
        repeat = repeat_ok.any(-1)  # [B]
        previous = previous_ok.any(-1) & ~repeat
        source = torch.where(repeat, (repeat_ok * prefer).argmax(-1), (previous_ok * prefer).argmax(-1))  # [B]
        at = states[source, min(length, past)].to(dtype)  # [B, K]; meaningful where `repeat`
        before = states[source, length - 1].to(dtype)  # [B, K]
        return Found(source, repeat, previous, at, before)

    def record(self, input_ids: torch.Tensor, found: Found, state: torch.Tensor) -> None:
        """Remember this call: its tokens, and `state` `(rows, K)` as `S(L)` after the source rows' history."""
        rows, length = input_ids.shape
        matched = found.repeat | found.previous  # [B]
        state = state[:, None] if state.ndim == 1 else state  # [B, K] (an empty batch too)
        if self.states is not None and self.known is not None and self.states.device == state.device \
                and self.states.shape[-1] == state.shape[-1] and length <= self.states.shape[1]:
            if found.own:  # no rows to gather
                earlier, earlier_known = self.states[:, :length].to(state.dtype), self.known[:, :length]
            else:
                earlier = self.states[found.source, :length].to(state.dtype)  # [B, L, K]
                earlier_known = self.known[found.source, :length] & matched[:, None]  # [B, L]
        else:
            earlier = torch.zeros(rows, length, state.shape[-1], dtype=state.dtype, device=state.device)
            earlier_known = torch.zeros(rows, length, dtype=torch.bool, device=state.device)
        self.ids = input_ids
        self.kinds = self.kinds_for(rows, input_ids.device)
        self.states = torch.cat([earlier, state[:, None]], dim=1)  # [B, L + 1, K]
        self.known = torch.cat([earlier_known, torch.ones(rows, 1, dtype=torch.bool, device=state.device)], dim=1)

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Row `i` now continues what row `beam_idx[i]` was."""
        if self.ids is None or self.states is None or self.known is None:
            return
        index = beam_idx.to(self.ids.device).long()
        self.ids, self.states, self.known = self.ids[index], self.states[index], self.known[index]
        if self.kinds is not None:
            self.kinds = self.kinds[index]

    def rollback(self, lengths: torch.Tensor) -> None:
        """Row `i` now has `lengths[i]` tokens: what came after is forgotten (no repeat beyond it)."""
        if self.ids is None or self.states is None or self.known is None:
            return
        lengths = lengths.to(self.ids.device).long()[:, None]  # [B, 1]
        positions = torch.arange(self.states.shape[1], device=self.ids.device)  # [P + 1]
        self.ids = self.ids.masked_fill(positions[:-1] >= lengths, -1)
        self.known = self.known & (positions <= lengths)
