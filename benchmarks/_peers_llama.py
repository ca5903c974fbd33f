"""llama.cpp's C samplers through llama-cpp-python's low-level bindings, without a model (optional).

`llama_sampler_init_*` needs no model for top-k, top-p, min-p, temperature, the penalties and the
draw; DRY takes a vocabulary only to turn string sequence breakers into token sequences, so it runs
with none and no breakers (`vocab=NULL, num_breakers=0`). Each row gets its own chain (the penalties
and DRY keep their history per sequence: the row's tokens are given to `llama_sampler_accept`), and
`llama_sampler_apply` runs on the row's `llama_token_data_array` (`{id, logit, p}` per token), as
llama.cpp's `common_sampler` does for each sequence. A `Rows` object holds the arrays filled from the
logits: filling them is the copy llama.cpp's caller makes from the model's output, done before the
timer; the timed call is the loop of C calls over the rows.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np
import torch

try:
    import llama_cpp
except ImportError:  # optional: peers.py says so and runs without it
    llama_cpp = None

TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


def available() -> str | None:
    """llama-cpp-python's version, or None when it is not installed."""
    return None if llama_cpp is None else str(llama_cpp.__version__)


class Chain:
    """One llama.cpp sampler chain per row, in llama.cpp's order (penalties, DRY, top-k, top-p, min-p, temperature,
    dist), each stage present when its option is given."""

    def __init__(self, rows: int, history: torch.Tensor | None = None, *, penalty_last_n: int = 64,
                 repeat: float = 1.0, frequency: float = 0.0, presence: float = 0.0, dry_multiplier: float = 0.0,
                 dry_base: float = 1.75, dry_allowed_length: int = 2, dry_last_n: int = 0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, temperature: float | None = None,
                 seed: int | None = None) -> None:
        lib = llama_cpp
        self.chains = []
        for row in range(rows):
            chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
            stages = []
            if repeat != 1.0 or frequency or presence:
                stages.append(lib.llama_sampler_init_penalties(0, penalty_last_n, repeat, frequency, presence))
            if dry_multiplier:
                stages.append(lib.llama_sampler_init_dry(None, dry_multiplier, dry_base, dry_allowed_length,
                                                         dry_last_n, None, 0))
            if top_k:
                stages.append(lib.llama_sampler_init_top_k(top_k))
            if top_p < 1.0:
                stages.append(lib.llama_sampler_init_top_p(top_p, 1))
            if min_p:
                stages.append(lib.llama_sampler_init_min_p(min_p, 1))
            if temperature is not None:
                stages.append(lib.llama_sampler_init_temp(temperature))
            if seed is not None:
                stages.append(lib.llama_sampler_init_dist(seed + row))
            for stage in stages:
                lib.llama_sampler_chain_add(chain, stage)
            if history is not None:
                for token in history[row].tolist():
                    lib.llama_sampler_accept(chain, token)
            self.chains.append(chain)

    def rows(self, logits: torch.Tensor) -> Rows:
        return Rows(logits)

    def apply(self, rows: Rows) -> None:
        """The timed part: llama.cpp's chain on each row, one C call per row."""
        apply = llama_cpp.llama_sampler_apply
        for chain, array in zip(self.chains, rows.arrays):
            apply(chain, array)

    def free(self) -> None:
        for chain in self.chains:
            llama_cpp.llama_sampler_free(chain)
        self.chains = []


class Rows:
    """The rows' `llama_token_data_array`s, filled from float32 logits `[B, V]` (outside the timer)."""

    def __init__(self, logits: torch.Tensor) -> None:
        values = logits.float().numpy()  # [B, V]
        self.data = np.zeros(values.shape, TOKEN_DATA)  # [B, V]
        self.data["id"] = np.arange(values.shape[1], dtype=np.int32)
        self.data["logit"] = values
        pointer = llama_cpp.llama_token_data_p
        self.structs = [llama_cpp.llama_token_data_array(data=row.ctypes.data_as(pointer), size=row.shape[0],
                                                         selected=-1, sorted=False) for row in self.data]
        self.arrays = [ctypes.byref(struct) for struct in self.structs]

    def kept(self) -> list[dict[int, float]]:
        """Each row's candidates after the chain: token id -> logit."""
        out = []
        for row, struct in zip(self.data, self.structs):
            size = struct.size
            out.append(dict(zip(row["id"][:size].tolist(), row["logit"][:size].tolist())))
        return out

    def dense(self) -> torch.Tensor:
        """`[B, V]` float32: each row's candidates at their token ids, `-inf` for the tokens the chain removed."""
        out = torch.full(self.data.shape, float("-inf"))  # [B, V]
        for index, (row, struct) in enumerate(zip(self.data, self.structs)):
            size = struct.size
            ids = torch.from_numpy(row["id"][:size].astype(np.int64))
            out[index, ids] = torch.from_numpy(row["logit"][:size].copy())
        return out


def kept_of(scores: torch.Tensor) -> list[dict[int, float]]:
    """The finite entries of processed scores `[B, V]`, per row: token id -> value."""
    out = []
    for row in scores:
        ids = torch.isfinite(row).nonzero().flatten()
        out.append(dict(zip(ids.tolist(), row[ids].tolist())))
    return out


def agree(ours: Sequence[dict[int, float]], theirs: Sequence[dict[int, float]],
          atol: float = 1e-4) -> tuple[bool, bool]:
    """(kept sets equal in every row, values equal within `atol` in every row)."""
    sets = all(a.keys() == b.keys() for a, b in zip(ours, theirs))
    values = sets and all(abs(a[k] - b[k]) <= atol for a, b in zip(ours, theirs) for k in a)
    return sets, values
