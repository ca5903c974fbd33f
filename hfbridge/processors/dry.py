"""DRY, "don't repeat yourself", as a `transformers.LogitsProcessor`: penalise tokens that extend a repeat.

Definition (per row), llama.cpp's `llama_sampler_dry_apply`, over the window of the last
`penalty_last_n` tokens of `input_ids` (`-1`: all of them; `0`: off):

1. Sequence breakers limit how far back a repeat may reach: at the breaker occurrence nearest the
   end of the window, `rep_limit` is the number of tokens after it (no breaker: the window's
   length). A row with `rep_limit < allowed_length` is left unchanged, as is a window of at most
   `allowed_length` tokens.
2. For every earlier position `j`, `n_j` is how many tokens the sequence ending at `j` shares with
   the window's ending (both read backwards), capped at `rep_limit`.
3. The token right after position `j` would extend that repeat: if `n_j >= allowed_length`, it gets
   `score -= multiplier * base ** (n_j - allowed_length)` for the largest such `n_j`, the exponent
   capped at `int(88.7228391 / log(base))` (llama.cpp's guard against float overflow). Single-token
   breakers are never penalised.

Breakers are strings (with `tokenizer=`; llama.cpp's rules, `_dry_breakers.py`) or token-id
sequences. Reference: p-e-w's DRY (text-generation-webui PR #5677), ported by pi6am to koboldcpp
and llama.cpp; llama.cpp `src/llama-sampler.cpp`; defaults from `common/common.h`:
`dry_multiplier = 0.0` (off), `dry_base = 1.75`, `dry_allowed_length = 2`, `dry_penalty_last_n = -1`,
`dry_sequence_breakers = {"\\n", ":", "\\"", "*"}`. Differences: llama.cpp's `-1` means the model's
training context (here: the whole of `input_ids`); text-generation-webui penalises by
`multiplier * base ** (n - allowed)` without the cap, and matches breakers as single tokens only.

Two paths, chosen by where the tensors live. On the CPU (`_dry_cpu.py`) NumPy searches every
row at once from the positions holding the window's last token, the only possible repeats, so the
work follows the repeats present. Elsewhere (accelerators, `torch.compile`, `accelerator_route()`)
the search is batched and sync-free: step 2 is a binary search on every position at once over
polynomial hashes of the window's prefixes (64-bit wrapping arithmetic, about 10 passes over a
`(rows, window)` tensor), step 3 one scatter into the scores; two different token strings of the
window compare equal only under a 64-bit hash collision.

>>> import torch
>>> dry = DRYLogitsProcessor(1.0, base=1.1, allowed_length=2, sequence_breakers=[])
>>> dry(torch.tensor([[0, 1, 2, 0, 1]]), torch.zeros(1, 4))
tensor([[ 0.,  0., -1.,  0.]])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessor

from hfbridge.processors._cpu_side import host_copy, host_path, scores_owned
from hfbridge.processors._dry_breakers import Breakers, compile_breakers
from hfbridge.processors._dry_cpu import HostRows, batch_penalties
from hfbridge.processors._dry_explain import DRYMatch, dry_matches
from hfbridge.processors._rows import RowParam

__all__ = ["DEFAULT_SEQUENCE_BREAKERS", "DRYLogitsProcessor"]

DEFAULT_SEQUENCE_BREAKERS = ("\n", ":", "\"", "*")
_FLOAT_MAX_LOG = 88.7228391  # llama.cpp's bound on the exponent: base ** e stays a float
_MASK64 = (1 << 64) - 1
_BASE = 6364136223846793005  # odd: invertible modulo 2 ** 64
_MIX = 0x9E3779B97F4A7C15  # spreads token ids over 64 bits


class DRYLogitsProcessor(LogitsProcessor):
    """Penalise the tokens that would extend a repeated sequence (see the module).

    Args:
        multiplier: Penalty scale (>= 0; 0 = off). One value, or one per row.
        base: Growth of the penalty with the repeat's length (>= 1). Default: 1.75.
        allowed_length: Repeats up to this long are free (int >= 1). Default: 2.
        penalty_last_n: The window: the last n tokens (-1 = all, 0 = off). Default: -1.
        sequence_breakers: Strings (need `tokenizer`) or token-id sequences. Default:
            `("\\n", ":", "\\"", "*")`.
        tokenizer: A transformers tokenizer, for string breakers.
    """

    keeps_ids_intact = True  # traits (`hfbridge.processors._traits`): reads the ids, keeps none
    sampler_name = "dry"

    def __init__(self, multiplier: Any, base: Any = 1.75, allowed_length: Any = 2, penalty_last_n: Any = -1,
                 sequence_breakers: Iterable[Any] = DEFAULT_SEQUENCE_BREAKERS, tokenizer: Any = None):
        self.multiplier = RowParam("multiplier", multiplier, minimum=0.0)
        self.base = RowParam("base", base, minimum=1.0)
        self.allowed_length = RowParam("allowed_length", allowed_length, integer=True, minimum=1)
        self.penalty_last_n = RowParam("penalty_last_n", penalty_last_n, integer=True, minimum=-1)
        self.breakers: Breakers = compile_breakers(sequence_breakers, tokenizer)
        self.sequence_breakers = list(sequence_breakers)
        # llama.cpp: max_exponent = FLOAT_MAX_LOG / log(base) in float, truncated; 0 (no cap) for base ~ 1
        self._max_exponent = tuple(_max_exponent(b) for b in self.base.values)
        self._powers: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._cap_tensors: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._numpy_masks: dict[int, tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]] = {}
        self._settings: dict[int, _RowSettings] = {}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows, length = input_ids.shape  # [B, T]
        settings = self._row_settings(rows)
        if settings.uniform:  # one window for every row: no per-row lists
            size = settings.window(0, length)
            if size <= settings.allowed[0]:  # llama.cpp: a window <= allowed_length does nothing
                return scores
            windows, live = [size] * rows, [True] * rows
        else:
            windows = [settings.window(row, length) for row in range(rows)]
            live = [w > a for w, a in zip(windows, settings.allowed)]
            if not any(live):
                return scores
        if host_path(input_ids, scores):  # on the CPU NumPy wins at every batch size (benchmarks/README.md)
            return self._on_host(input_ids, scores, settings, windows, live)
        width = max(w for w, on in zip(windows, live) if on)  # M
        device = scores.device
        window = input_ids[:, length - width:].long()  # [B, M], oldest first
        # on the device from cached per-row tensors: a fresh host tensor would be a copy that waits for the device
        allowed_t = self.allowed_length.tensor(rows, device, torch.long)[:, None]  # [B, 1]
        last_n = self.penalty_last_n.tensor(rows, device, torch.long)  # [B]
        off = (self.multiplier.tensor(rows, device) == 0) | (last_n == 0)
        sizes = torch.where(off, 0, torch.where(last_n == -1, length, last_n.clamp(max=length)))  # [B] windows
        start = torch.where(sizes > allowed_t.squeeze(1), width - sizes, width)  # [B]
        limit = self._rep_limit(window, start, scores.shape[1])  # [B]
        caps = [a + e if e > 0 else width for a, e in zip(settings.allowed, self._max_exponent_rows(rows))]
        longest = min(width - 1, max(caps))
        repeats = self._repeats(window, start, longest)  # [B, M - 1]: n_j for j < M - 1
        repeats = torch.minimum(repeats, limit[:, None])
        penalised = (repeats >= allowed_t) & (limit >= allowed_t.squeeze(1))[:, None]  # [B, M - 1]
        following = window[:, 1:]  # [B, M - 1]: the token that would extend the repeat ending at j
        single, _ = self.breakers.masks(scores.shape[1], device)
        penalised &= ~_lookup(single, following)
        exponent = (repeats - allowed_t).clamp(min=0)
        cap = self._caps(rows, device)  # [B, 1]
        exponent = torch.where((cap > 0) & (exponent > cap), cap, exponent)
        # llama.cpp: float penalty = multiplier * std::pow(base, e) (a double product, stored as float)
        factor = self.multiplier.tensor(rows, device, torch.float64)[:, None]
        penalty = (factor * self.base.tensor(rows, device, torch.float64)[:, None].pow(exponent)).to(scores.dtype)
        penalty = torch.where(penalised, penalty, torch.zeros_like(penalty))
        old = scores.gather(1, following)  # [B, M - 1]
        # the largest penalty of a token wins: scatter the minimum of score - penalty (rounding is monotone)
        if scores_owned():
            return scores.scatter_reduce_(1, following, old - penalty, reduce="amin", include_self=True)
        return scores.scatter_reduce(1, following, old - penalty, reduce="amin", include_self=True)

    # a trait for views: `describe_last` after a call on any sequence's ids says what the step there did
    replays_from_ids = True

    def describe_last(self, input_ids: torch.Tensor) -> list[list[DRYMatch]]:
        """Why this processor penalised what it did to `input_ids` `(rows, seq)`: per row, each penalised
        token's `DRYMatch` (the repeat it would extend, its length and penalty), largest penalty first.

        A function of `input_ids` alone (DRY keeps no state): give the `input_ids` of the call to explain.
        Recomputed in plain Python when asked (views call it), never during a step.
        """
        return dry_matches(self, input_ids)

    def _on_host(self, input_ids: torch.Tensor, scores: torch.Tensor, settings: _RowSettings, windows: list[int],
                 live: list[bool]) -> torch.Tensor:
        """The CPU path (`_dry_cpu.py`): the live rows searched at once with NumPy, one indexed write."""
        rows, vocab = scores.shape
        single, groups = self._host_masks(vocab)
        ids = input_ids.numpy()  # [B, T], the caller's memory: read only
        length = ids.shape[1]
        if settings.uniform:
            chosen = None
            window = ids[:, length - windows[0]:]  # [B, M]
            host = settings.host
        else:
            chosen = [row for row in range(rows) if live[row]]
            width = max(windows[row] for row in chosen)  # M
            window = ids[chosen, length - width:]  # [B', M], a copy
            host = settings.host_rows(chosen, [width - windows[row] for row in chosen])
        # C order, as batch_penalties reads it flat: a copy only when part of the ids
        if not window.flags.c_contiguous:
            window = np.ascontiguousarray(window)
        found, tokens, amounts = batch_penalties(window, host, single, groups)
        out = scores if scores_owned() else host_copy(scores)
        if not found.size:
            return out
        if chosen is not None:
            found = np.array(chosen)[found]
        if out.dtype in (torch.float32, torch.float64) and not out.requires_grad:
            view = out.numpy()  # [B, V], the same memory
            # each (row, token) once, with its largest penalty rounded to the scores' dtype: one subtraction
            with np.errstate(over="ignore"):  # a penalty past float32's range is inf, as torch's cast gives
                amounts = amounts.astype(view.dtype)
            if view.flags.c_contiguous:
                view.reshape(-1)[found * vocab + tokens] -= amounts
            else:
                view[found, tokens] -= amounts
            return out
        where = (torch.from_numpy(found), torch.from_numpy(tokens))
        # x + (-p) is x - p, one rounding
        return out.index_put_(where, torch.from_numpy(amounts).to(out.dtype).neg_(), accumulate=True)

    def _row_settings(self, rows: int) -> _RowSettings:
        cached = self._settings.get(rows)
        if cached is None:
            cached = _RowSettings(self.multiplier.for_rows(rows), self.base.for_rows(rows),
                                  self.allowed_length.for_rows(rows), self.penalty_last_n.for_rows(rows),
                                  self._max_exponent_rows(rows))
            self._settings[rows] = cached
        return cached

    def _host_masks(self, vocab: int) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        cached = self._numpy_masks.get(vocab)
        if cached is None:
            single, groups = self.breakers.masks(vocab, torch.device("cpu"))
            cached = (single.numpy(), [(heads.numpy(), tail.numpy()) for heads, tail in groups])
            self._numpy_masks[vocab] = cached
        return cached

    def _caps(self, rows: int, device: torch.device) -> torch.Tensor:
        """`(rows, 1)` long: each row's cap on the exponent (0: none), kept per batch size and device."""
        key = (rows, device)
        cached = self._cap_tensors.get(key)
        if cached is None:
            cached = torch.tensor(self._max_exponent_rows(rows), device=device)[:, None]
            self._cap_tensors[key] = cached
        return cached

    def _max_exponent_rows(self, rows: int) -> tuple[int, ...]:
        return self._max_exponent * rows if self.base.scalar else self._max_exponent

    def _rep_limit(self, window: torch.Tensor, start: torch.Tensor, vocab: int) -> torch.Tensor:
        """`(rows,)` llama.cpp's step 1: tokens after the breaker nearest the end (else the window's length)."""
        width = window.shape[1]
        device = window.device
        single, groups = self.breakers.masks(vocab, device)
        position = torch.arange(width, device=device)  # [M]
        inside = position >= start[:, None]  # [B, M]
        match = torch.where(_lookup(single, window) & inside, 0, -1)  # [B, M]: longest breaker tail starting at j
        for heads, tail in groups:
            size = tail.numel()
            if size >= width:
                continue
            found = _lookup(heads, window[:, : width - size])  # [B, M - L]
            for offset in range(size):
                found &= window[:, offset + 1: width - size + offset + 1] == tail[offset]
            found &= inside[:, : width - size]
            match[:, : width - size] = torch.where(found, torch.clamp(match[:, : width - size], min=size),
                                                   match[:, : width - size])
        nearest = torch.where(match >= 0, position, -1).amax(-1)  # [B]: the breaker head nearest the end
        tail = match.gather(1, nearest.clamp(min=0)[:, None]).squeeze(1)
        return torch.where(nearest >= 0, width - 1 - nearest - tail, width - start)

    def _repeats(self, window: torch.Tensor, start: torch.Tensor, longest: int) -> torch.Tensor:
        """`(rows, M - 1)` for each j < M - 1, the length of the longest common ending of
        `window[:, :j + 1]` and `window` inside the row's window, up to at least `longest`."""
        rows, width = window.shape
        device = window.device
        powers, inverses = self._hash_powers(width + 1, device)  # [M + 1] each
        mixed = (window + 1) * _signed(_MIX)  # wraps modulo 2 ** 64
        prefix = torch.zeros(rows, width + 1, dtype=torch.long, device=device)
        prefix[:, 1:] = torch.cumsum(mixed * powers[:width], dim=1)  # [B, M + 1]: hash of window[:, :t]
        ends = torch.arange(1, width, device=device)  # [M - 1]: j + 1
        end_hash = prefix[:, 1:width]  # [B, M - 1]: prefix up to j + 1
        # the window's ending of each length L, hashed: (S[M] - S[M - L]) * BASE^-(M - L), for L = 0..M
        ending = (prefix[:, width:] - prefix.flip(1)) * inverses[: width + 1].flip(0)  # [B, M + 1]
        found = torch.zeros(rows, width - 1, dtype=torch.long, device=device)
        for level in reversed(range(max(longest, 1).bit_length())):
            trial = found + (1 << level)  # [B, M - 1]
            begin = ends - trial  # the trial sequence ending at j starts here
            fits = begin >= start[:, None]
            begin = begin.clamp(min=0)
            ours = (end_hash - prefix.gather(1, begin)) * inverses.index_select(0, begin.flatten()).view_as(begin)
            theirs = ending.gather(1, trial.clamp(max=width))
            found = torch.where(fits & (ours == theirs), trial, found)
        return found

    def _hash_powers(self, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`BASE ** i` and `BASE ** -i` modulo 2 ** 64 (as signed int64) for i < size, kept per device."""
        cached = self._powers.get(device)
        if cached is None or cached[0].numel() < size:
            size = max(size, 2 * (cached[0].numel() if cached is not None else 512))
            inverse = pow(_BASE, -1, 1 << 64)
            powers, inverses, p, q = [], [], 1, 1
            for _ in range(size):
                powers.append(_signed(p))
                inverses.append(_signed(q))
                p, q = (p * _BASE) & _MASK64, (q * inverse) & _MASK64
            cached = (torch.tensor(powers, dtype=torch.long, device=device),
                      torch.tensor(inverses, dtype=torch.long, device=device))
            self._powers[device] = cached
        return cached

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(multiplier={self.multiplier}, base={self.base}, allowed_length="
                f"{self.allowed_length}, penalty_last_n={self.penalty_last_n}, sequence_breakers="
                f"{len(self.breakers)} token sequences)")


class _RowSettings:
    """A batch size's per-row values, as lists and as the host path's arrays (built once per batch size)."""

    def __init__(self, multiplier: Sequence[float], base: Sequence[float], allowed: Sequence[int],
                 last_n: Sequence[int], caps: Sequence[int]):
        self.off = [m == 0 or n == 0 for m, n in zip(multiplier, last_n)]
        self.allowed = [int(a) for a in allowed]
        self.last_n = [int(n) for n in last_n]
        rows = len(self.allowed)
        self.uniform = all(len(set(values)) == 1 for values in (multiplier, base, allowed, last_n))
        self._values = ([float(m) for m in multiplier], [float(b) for b in base], list(caps))
        self.host = self.host_rows(list(range(rows)), [0] * rows)

    def window(self, row: int, length: int) -> int:
        """The row's window for `length` tokens of `input_ids` (0: off)."""
        last_n = self.last_n[row]
        return 0 if self.off[row] else length if last_n == -1 else min(last_n, length)

    def host_rows(self, chosen: list[int], start: list[int]) -> HostRows:
        """The chosen rows' `HostRows`, their windows beginning at `start`."""
        multiplier, base, caps = self._values
        allowed = [self.allowed[row] for row in chosen]
        return HostRows(np.array(start, dtype=np.int64),
                        [multiplier[row] for row in chosen], [base[row] for row in chosen],
                        np.array(allowed, dtype=np.int64), np.array([caps[row] for row in chosen], dtype=np.int64),
                        pair=min(allowed, default=1) >= 2, shifted=any(start))


def _signed(value: int) -> int:
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _lookup(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`table[index]` for a 1-D table, by `index_select` (several times faster than indexing on CPU)."""
    return table.index_select(0, index.flatten()).view(index.shape)


def _max_exponent(base: float) -> int:
    """llama.cpp's `int(FLOAT_MAX_LOG / std::log(base))` in float32, 0 (no cap) for `base <= 1.000001`."""
    value = torch.tensor(base, dtype=torch.float32)
    if not bool(value > torch.tensor(1.000001, dtype=torch.float32)):
        return 0
    return int(torch.tensor(_FLOAT_MAX_LOG, dtype=torch.float32) / torch.log(value))
