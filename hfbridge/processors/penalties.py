"""Presence and frequency penalties (OpenAI's and llama.cpp's), as a `transformers.LogitsProcessor`.

Definition: with `count(c)` how often token `c` occurs in the counted window,

    score[c] -= count(c) * frequency_penalty + [count(c) > 0] * presence_penalty

Which tokens are counted:

- `penalty_last_n=None` (default): the *generated* tokens, `input_ids[:, prompt_length:]` — the
  meaning of OpenAI's API and vLLM. It needs `prompt_length` (`generate` knows it; `sample_step`
  and `Sampler` take `prompt_length=`).
- `penalty_last_n=n > 0`: the last `n` tokens of `input_ids`, prompt included; `-1` means all of
  them, `0` turns the processor off — llama.cpp's `penalty_last_n` (`repeat_last_n`).

`repetition_penalty` (default 1.0, off) applies llama.cpp's repetition penalty to the tokens of the
same window first (a score `<= 0` is multiplied by it, a positive one divided), exactly as
llama.cpp's `penalties` sampler does in one loop; hfbridge uses it when `penalty_last_n` is given
together with `repetition_penalty`, so that both look at the same window. HF's own
`RepetitionPenaltyLogitsProcessor` looks at the whole of `input_ids`.

Reference: llama.cpp `src/llama-sampler.cpp`, `llama_sampler_penalties_apply`; defaults from
`common/common.h`: `penalty_last_n = 64`, `penalty_repeat = 1.0`, `penalty_freq = 0.0`,
`penalty_present = 0.0` (hfbridge's default window is OpenAI's, the generated tokens).
text-generation-webui counts the whole context (its `presence_penalty` / `frequency_penalty`
use `repetition_penalty_range`).

Batched: the window's tokens are counted by one scatter; no loop over rows or tokens, no host read.

>>> import torch
>>> ids = torch.tensor([[0, 1, 1]])
>>> p = PresenceFrequencyPenaltyLogitsProcessor(presence_penalty=0.5, frequency_penalty=1.0, penalty_last_n=-1)
>>> p(ids, torch.zeros(1, 3)).tolist()
[[-1.5, -2.5, 0.0]]
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessor

from hfbridge.processors._cpu_side import fused_path, row_copy, scores_owned, zeroed
from hfbridge.processors._rows import RowParam, described

__all__ = ["PresenceFrequencyPenaltyLogitsProcessor"]

_COUNTED_IN_PYTHON = 128  # one row's window of up to this many ids is counted by `Counter` (a sort beyond)
_HOST_IDS = 4096  # CPU windows of up to this many ids (all rows) are counted with NumPy: a sort, no buffer


class PresenceFrequencyPenaltyLogitsProcessor(LogitsProcessor):
    """`score[c] -= count(c) * frequency_penalty + [count(c) > 0] * presence_penalty` (see the module).

    Args:
        presence_penalty: Subtracted once from every token in the window. Any finite number
            (OpenAI allows -2 to 2). Default: 0.0. One value, or one per row.
        frequency_penalty: Subtracted once per occurrence. Default: 0.0. One value, or one per row.
        penalty_last_n: `None`: count the generated tokens (needs `prompt_length`). `n > 0`: the
            last `n` tokens of `input_ids`; `-1`: all of them; `0`: off. Default: None.
        prompt_length: The prompt's length in tokens, for `penalty_last_n=None`.
        repetition_penalty: llama.cpp's repetition penalty on the same window, applied first
            (> 0; 1.0 = off). Default: 1.0.
    """

    keeps_ids_intact = True  # traits (`hfbridge.processors._traits`): reads the ids, keeps none
    sampler_name = "penalties"

    def __init__(self, presence_penalty: Any = 0.0, frequency_penalty: Any = 0.0, penalty_last_n: Any = None,
                 prompt_length: int | None = None, repetition_penalty: Any = 1.0):
        self.presence_penalty = RowParam("presence_penalty", presence_penalty)
        self.frequency_penalty = RowParam("frequency_penalty", frequency_penalty)
        self.repetition_penalty = RowParam("repetition_penalty", repetition_penalty, above=0.0)
        self.penalty_last_n = None if penalty_last_n is None else RowParam(
            "penalty_last_n", penalty_last_n, integer=True, minimum=-1)
        if prompt_length is not None and (isinstance(prompt_length, bool) or not isinstance(prompt_length, int)
                                          or prompt_length < 0):
            raise ValueError(f"`prompt_length` must be an int >= 0 (the prompt's length in tokens), got "
                             f"{described(prompt_length)}.")
        if penalty_last_n is None and prompt_length is None:
            raise ValueError(
                "presence/frequency penalties count the generated tokens, so they need `prompt_length=` (the "
                "prompt's length in tokens); or pass `penalty_last_n=` to count the last n tokens of input_ids, "
                "prompt included (-1 = all of them, llama.cpp's meaning)."
            )
        self.prompt_length = prompt_length
        self._host_cache: dict[tuple[int, torch.dtype], tuple] = {}  # `_host_values`, per batch size and dtype
        self._one_row_cache: dict[torch.dtype, tuple] = {}  # `_one_row_values`, per dtype
        self._all_off = (self.presence_penalty.all(lambda v: v == 0) and self.frequency_penalty.all(lambda v: v == 0)
                         and self.repetition_penalty.all(lambda v: v == 1))  # the values never change

    def _starts(self, rows: int, length: int) -> list[int]:
        """Per row, the first position of `input_ids` in the window (`length` = off)."""
        if self.penalty_last_n is None:
            return [min(int(self.prompt_length or 0), length)] * rows
        if self.penalty_last_n.scalar:
            return [_window_start(self.penalty_last_n.values[0], length)] * rows
        return [_window_start(n, length) for n in self.penalty_last_n.for_rows(rows)]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows, length = input_ids.shape  # [B, T]
        if rows == 0:
            return scores
        starts = self._starts(rows, length)
        first = min(starts)
        if first >= length or self._all_off:
            return scores
        if input_ids.is_cpu and (length - first) * rows <= _HOST_IDS and fused_path(scores):
            if rows == 1 and length - first <= _COUNTED_IN_PYTHON:
                return self._one_row(input_ids, scores, first, scores.shape[1])
            return self._on_host(input_ids, scores, starts, first)
        window = input_ids[:, first:].long()  # [B, M], oldest first
        device = scores.device
        counted = None  # [B, M] bool: the position lies in the row's own window
        if any(start != first for start in starts):
            offsets = torch.tensor(starts, device=device)[:, None] - first
            counted = torch.arange(window.shape[1], device=device) >= offsets
        weights = torch.ones(window.shape, dtype=scores.dtype, device=device) if counted is None \
            else counted.to(scores.dtype)
        counts = self._counts(scores, window, weights)  # [B, M] each position's token's count in its row
        old = scores.gather(1, window)  # [B, M]
        repeat = self.repetition_penalty.tensor(rows, device, scores.dtype)[:, None]
        new = torch.where(old <= 0, old * repeat, old / repeat)  # llama.cpp: `<= 0` multiplies
        frequency = self.frequency_penalty.tensor(rows, device, scores.dtype)[:, None]
        presence = self.presence_penalty.tensor(rows, device, scores.dtype)[:, None]
        new = new - (counts * frequency + (counts > 0).to(scores.dtype) * presence)
        # every position of a token writes the same value (its count is the row's), so duplicates agree
        values = torch.where(counts > 0, new, old)
        return scores.scatter_(1, window, values) if scores_owned() else scores.scatter(1, window, values)

    def _on_host(self, input_ids: torch.Tensor, scores: torch.Tensor, starts: list[int], first: int) -> torch.Tensor:
        """The same arithmetic on NumPy views, for a short window: each (row, token) counted once (one row's
        window of up to 128 ids: `_one_row`; else a sort of `row * vocab + token`), then
        `old -> old * or / repeat - (count * frequency + presence)` in the scores' dtype, op for op as the
        batched path (IEEE operations give the same bits)."""
        rows, vocab = scores.shape
        ids = input_ids.numpy()[:, first:]  # [B, M], the caller's memory: read only
        # else one row's id would land in another row; unsigned, a negative id is huge: one reduction
        if ids.view(np.uint64).max() >= vocab if ids.dtype == np.int64 else ids.min() < 0 or ids.max() >= vocab:
            _outside(self, ids, vocab)
        keys = ids + np.arange(rows)[:, None] * vocab  # [B, M]: row * vocab + token
        if any(start != first for start in starts):
            keys = keys[np.arange(ids.shape[1]) >= np.array(starts)[:, None] - first]  # each row's own window
        keys, counts = _counted(keys.ravel())  # [K] each (row, token) once
        where = keys // vocab, keys % vocab  # rows, tokens
        out = scores if scores_owned() else scores.clone()
        view = out.numpy()  # [B, V], the same memory
        old = view[where]  # [K]
        repeat, frequency, presence = self._host_values(rows, scores.dtype)  # [B] each, in the scores' dtype
        if rows > 1:
            repeat, frequency, presence = repeat[where[0]], frequency[where[0]], presence[where[0]]  # [K] each
        with np.errstate(all="ignore"):  # inf and NaN scores give what torch gives, without warnings
            new = np.where(old <= 0, old * repeat, old / repeat)  # llama.cpp: `<= 0` multiplies
            view[where] = new - (counts.astype(view.dtype) * frequency + presence)
        return out

    def _one_row(self, input_ids: torch.Tensor, scores: torch.Tensor, first: int, vocab: int) -> torch.Tensor:
        """`_on_host` for one row's short window: a plain count costs less than any NumPy sort."""
        counter = Counter(input_ids.numpy()[0, first:].tolist())  # the caller's memory: read only
        if min(counter) < 0 or max(counter) >= vocab:
            _outside(self, input_ids.numpy()[:, first:], vocab)
        # [V]: the owned scores' own memory, or a private copy's (`fused_path` has checked the scores)
        out, row = (scores, scores.numpy()[0]) if scores_owned() else row_copy(scores)
        tokens = np.fromiter(counter, dtype=np.int64, count=len(counter))  # [K]
        counts = np.fromiter(counter.values(), dtype=np.int64, count=len(counter))  # [K]
        old = row[tokens]  # [K]
        repeat, penalty = self._one_row_values(scores.dtype)
        with np.errstate(all="ignore"):  # inf and NaN scores give what torch gives, without warnings
            # llama.cpp: `<= 0` multiplies
            new = old if repeat is None else np.where(old <= 0, old * repeat, old / repeat)
            row[tokens] = new - penalty[counts]
        return out

    def _one_row_values(self, dtype: torch.dtype) -> tuple[np.generic | None, np.ndarray]:
        """One row's repetition penalty (None: 1, off) and `penalty[c] = c * frequency + presence` for every
        count `c` a short window can hold, in `dtype` (the batched path's two roundings): one lookup a step."""
        cached = self._one_row_cache.get(dtype)
        if cached is None:
            repeat, frequency, presence = self._host_values(1, dtype)  # NumPy scalars in `dtype`
            with np.errstate(all="ignore"):  # huge values overflow to inf, as torch's do
                penalty = np.arange(_COUNTED_IN_PYTHON + 1, dtype=frequency.dtype) * frequency + presence  # [129]
            cached = self._one_row_cache[dtype] = (None if repeat == 1 else repeat, penalty)
        return cached

    def _host_values(self, rows: int, dtype: torch.dtype) -> tuple[np.ndarray, ...]:
        """`(rows,)` repetition, frequency and presence values in `dtype`, NumPy views of the batched path's
        cached tensors; one row's are its NumPy scalars (the same arithmetic)."""
        key = (rows, dtype)
        cached = self._host_cache.get(key)
        if cached is None:
            cached = tuple(param.tensor(rows, torch.device("cpu"), dtype).numpy() for param in
                           (self.repetition_penalty, self.frequency_penalty, self.presence_penalty))
            if rows == 1:
                cached = tuple(values[0] for values in cached)
            self._host_cache[key] = cached
        return cached

    def _counts(self, scores: torch.Tensor, window: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """`(rows, M)` how often each window position's token occurs in its row's window (`weights` 1 or 0).

        On the host path the counting buffer is this thread's `(rows, vocab)` zeros (`_cpu_side.zeroed`), kept
        zero: the counts are added at the window's tokens, read, and those places set back to 0 (a few
        thousand writes instead of a vocabulary-sized zeroed tensor per call). Elsewhere a fresh one.
        """
        if not fused_path(scores):
            return torch.zeros_like(scores).scatter_add_(1, window, weights).gather(1, window)
        with zeroed(scores) as zeros:
            counts = zeros.scatter_add_(1, window, weights).gather(1, window)  # [B, M]
            zeros.scatter_(1, window, 0.0)  # zero again for the next call
        return counts

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(presence_penalty={self.presence_penalty}, frequency_penalty="
                f"{self.frequency_penalty}, penalty_last_n={self.penalty_last_n}, prompt_length={self.prompt_length}, "
                f"repetition_penalty={self.repetition_penalty})")


def _window_start(last_n: int, length: int) -> int:
    """The first position of a `length`-token context that `penalty_last_n=last_n` counts (`length`: none)."""
    return length if last_n == 0 else 0 if last_n == -1 else max(length - last_n, 0)


def _outside(processor: Any, ids: np.ndarray, vocab: int) -> None:
    bad = int(ids[(ids < 0) | (ids >= vocab)][0])
    raise IndexError(f"{type(processor).__name__}: `input_ids` hold token id {bad}, outside the vocabulary "
                     f"of the scores ({vocab} columns).")


def _counted(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(keys, return_counts=True)` for a fresh 1-D array (sorted in place), in a few NumPy calls:
    `np.unique`'s own Python layers cost several times more on a window of 64 ids."""
    keys.sort()
    first = np.empty(keys.shape[0], dtype=bool)  # [M]: where a new key starts
    first[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    ends = np.empty_like(starts)  # where each key's run ends (np.diff(append=) costs more than the rest)
    ends[:-1] = starts[1:]
    ends[-1:] = keys.shape[0]
    return keys[starts], ends - starts
