"""Vocabulary-sized buffers the fast path lends itself from step to step on the CPU.

A `(rows, vocab)` float32 tensor allocated fresh at every step costs more than the work done in it
when the C allocator has handed the memory back to the system since the last step: every 4 KiB page
is then faulted in and zeroed again. glibc's `malloc` does this for blocks of several MiB (they are
mapped, or trimmed from the top of the heap once free): at `(32, 128256)` the step that allocated its
division and its softmax anew faulted in 6,800 to 8,000 pages in some runs, 22 to 28 ms a step against
11 to 19 in runs without (`benchmarks/step.py --reads`). A `Sampler` keeps its buffers in its memo dict.

Two are lent: the softmax behind a top-p or min-p cut, which never leaves the step, and the division by
the temperature, which becomes the step's scores; those reach a processor that is neither hfbridge's nor
transformers' (it may keep what it receives) and a caller (`FastDraw.final_scores`) only as a copy
(`FastState.private`). The step's `FastState` outlives the step while the `Sampler` keeps the draw for a
later error message; a buffer goes back to the memo only when that state is gone, so it is never written
while anything of its step can still read it. Two steps of one `Sampler` at once (threads) each find or
make their own.

>>> import torch
>>> from hfbridge._step.fast.state import FastState
>>> memo, scores = {}, torch.zeros(2, 8)
>>> state = FastState(scores)
>>> buffer = lend_like(scores, state, memo, "probs")
>>> "probs" in memo
False
>>> del state                                             # the step is over: the buffer is back
>>> memo["probs"] is buffer
True
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

__all__ = ["lend_like"]


def lend_like(like: torch.Tensor, owner: Any, memo: dict | None, key: str) -> torch.Tensor | None:
    """An uninitialised contiguous tensor shaped as `like`, from `memo[key]` when it fits; back there once
    `owner` (the step's `FastState`) is gone. Without a memo (one-off calls) a fresh tensor.

    None when `like` needs autograd (scores that require grad, with grad mode on: torch refuses `out=` there), so
    the caller computes out of place as before. A buffer made inside `torch.inference_mode()` is not written
    outside it (torch refuses that too): a fresh one is made.
    """
    if like.requires_grad and torch.is_grad_enabled():
        return None
    buffer = None if memo is None else memo.pop(key, None)
    if buffer is None or buffer.shape != like.shape or buffer.dtype != like.dtype or buffer.device != like.device \
            or (buffer.is_inference() and not torch.is_inference_mode_enabled()):
        buffer = torch.empty(like.shape, dtype=like.dtype, device=like.device)
    if memo is not None:
        weakref.finalize(owner, memo.__setitem__, key, buffer)
    return buffer
