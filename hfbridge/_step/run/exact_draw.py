"""HF's draw, `torch.multinomial(probs, 1)`, on CPU without an exponential per token: the same tokens, the same stream.

On CPU, `torch.multinomial` with one sample picks, per row, the first index of the largest `p / q`
with `q ~ Exp(1)` drawn for every token of the batch (`probs.shape` values, row after row), each
`q` being `float(-log1p(-u))` with `u` the low 53 bits of one 64-bit draw of the generator,
times `2 ** -53`. Making those `q` (a logarithm per token) is most of its cost. A token with
`p = 0` has `p / q = 0` and never wins (the best token's ratio is above 0), so only the tokens
with `p > 0` need their `q`: `draw_one` takes the same 64-bit draws with `random_` on an int64
buffer (the generator ends where `torch.multinomial` leaves it), and computes `q` at those tokens
only. Where `u = 0` (`q = 0`; `0 / 0` is NaN, which `argmax` would pick) for any token, or the
probabilities are invalid, or the tokens with `p > 0` are too many to gain, it calls
`torch.multinomial` itself (the generator put back first). The first call checks the shortcut
against `torch.multinomial` on a small case and keeps `torch.multinomial` if they differ (another
torch build may draw otherwise).

>>> probs = torch.tensor([[0.0, 0.25, 0.75], [1.0, 0.0, 0.0]])
>>> draw_one(probs, torch.Generator().manual_seed(0)).tolist() == torch.multinomial(
...     probs, 1, generator=torch.Generator().manual_seed(0)).squeeze(1).tolist()
True
"""

from __future__ import annotations

import threading

import numpy
import torch

from hfbridge.processors._cpu_side import host_path

__all__ = ["draw_one", "softmax"]

_LOW_53 = (1 << 53) - 1
_DENSE = 4  # beyond 1 token in this many with p > 0, torch.multinomial (the logarithms are most of the work)
_CHUNK = 1 << 23  # draws taken at once, in whole rows (64 MiB of int64): larger batches draw in turn
_local = threading.local()  # per thread: the buffers of the last shape (no page faults on fresh memory)
_agrees: bool | None = None  # whether this torch draws as the module says (checked once)


def draw_one(probs: torch.Tensor, generator: torch.Generator | None = None, *,
             softmax_output: bool = False) -> torch.Tensor:
    """`(rows,)` the tokens `torch.multinomial(probs, 1, generator=generator)` draws; the generator ends as it would.

    Args:
        probs: `(rows, vocab)` probabilities (HF's softmax of the processed scores).
        generator: The generator, or None for torch's default one.
        softmax_output: `probs` is a softmax's result (NaN is then its only invalid value: one check).
    """
    if not _eligible(probs, generator) or not _shortcut_agrees():
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    tokens = _draw(probs, generator, softmax_output)
    if tokens is None:
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens


def softmax(scores: torch.Tensor) -> torch.Tensor:
    """HF's `softmax(scores, dim=-1)`; on the host path written into this thread's buffer, for `draw_one` only.

    The result is overwritten by the next call in this thread: draw from it, never keep it.
    """
    if scores.dtype != torch.float32 or scores.ndim != 2 or not host_path(scores):
        return torch.nn.functional.softmax(scores, dim=-1)
    held = getattr(_local, "probs", None)
    if held is None or held.shape != scores.shape:
        held = _local.probs = torch.empty(scores.shape, dtype=torch.float32)
    return torch.softmax(scores, -1, out=held)


def _eligible(probs: torch.Tensor, generator: torch.Generator | None) -> bool:
    return (probs.dtype == torch.float32 and probs.ndim == 2 and probs.is_contiguous() and probs.numel() > 0
            and host_path(probs) and (generator is None or generator.device.type == "cpu"))


def _buffers(rows: int, vocab: int) -> tuple[torch.Tensor, numpy.ndarray]:
    """This thread's int64 scratch for the draws of whole rows (at most `_CHUNK` values, at least one row)
    and `(rows, vocab)` bool scratch, made once per shape."""
    held = getattr(_local, "buffers", None)
    if held is None or held[1].shape != (rows, vocab):
        draws = min(rows, max(1, _CHUNK // vocab)) * vocab
        held = (torch.empty(draws, dtype=torch.int64), numpy.empty((rows, vocab), dtype=bool))
        _local.buffers = held
    return held


def _draw(probs: torch.Tensor, generator: torch.Generator | None, softmax_output: bool = False) -> torch.Tensor | None:
    """The tokens, or None where `torch.multinomial` must run itself (nothing drawn then)."""
    rows, vocab = probs.shape  # [B, V]
    probs = probs.detach()  # the logits of a model called without no_grad carry a graph
    if softmax_output:  # values in [0, 1], each row's best above 0, unless NaN (a row of -inf, NaN or +inf)
        if not bool(probs.sum(1).isfinite().all()):
            return None
    else:
        low, high = torch.aminmax(probs)
        if not (bool(high < torch.inf) and bool(low >= 0)) or bool((probs.sum(1) == 0).any()):
            return None  # torch.multinomial raises its own error
    raw, positive = _buffers(rows, vocab)
    numpy.greater(probs.numpy(), 0.0, out=positive)  # NumPy's comparison: about half of torch's time on CPU
    where = numpy.flatnonzero(positive)  # [K] flat indices, row after row
    if where.size * _DENSE > probs.numel():
        return None
    source = torch.default_generator if generator is None else generator
    state = source.get_state()
    span = raw.numel() // vocab  # rows drawn at once: the draws come row after row either way
    parts = []
    for first_row in range(0, rows, span):
        start, end = first_row * vocab, min(first_row + span, rows) * vocab
        chunk = raw[: end - start]
        chunk.random_(generator=source)  # one 64-bit draw per token, as the exponentials take them
        if _some_draw_zero(chunk):
            source.set_state(state)
            return None
        low, high = numpy.searchsorted(where, [start, end])
        parts.append(chunk[torch.from_numpy(where[low:high] - start)])
    at = torch.from_numpy(where)  # [K]
    u = (torch.cat(parts) & _LOW_53).double() * 2.0**-53  # exact: an integer below 2^53 times a power of two
    ratio = probs.view(-1)[at] / (-torch.log1p(-u)).float()  # [K] float32, as torch.multinomial divides
    row = at // vocab  # [K] sorted
    best = torch.full((rows,), -torch.inf).scatter_reduce_(0, row, ratio, "amax")  # [B]
    first = torch.where(ratio == best[row], at, rows * vocab)  # the first index holding the row's best
    picked = torch.full((rows,), rows * vocab, dtype=torch.long).scatter_reduce_(0, row, first, "amin")
    return picked - torch.arange(rows) * vocab


def _some_draw_zero(raw: torch.Tensor) -> bool:
    """Whether some draw's low 53 bits are all 0 (`u = 0`, `q = 0`): first a count of zero 32-bit words (one
    fast pass; a draw with `u = 0` has one), then, when there is one (about one batch in 500 at 4M tokens),
    the exact test."""
    words = raw.numpy().view(numpy.uint32)
    return bool(numpy.count_nonzero(words) < words.size) and bool(((raw & _LOW_53) == 0).any())


def _shortcut_agrees() -> bool:
    """Once per process: does the shortcut give `torch.multinomial`'s tokens and generator state here?"""
    global _agrees
    if _agrees is None:
        probs = torch.rand(6, 257, generator=torch.Generator().manual_seed(1))
        probs = probs * (probs > 0.9)  # mostly zeros
        probs[2] = 0.0
        probs[2, 5] = 1.0
        mine, theirs = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
        expected = torch.multinomial(probs, 1, generator=theirs).squeeze(1)
        got = _draw(probs, mine)
        _agrees = got is not None and torch.equal(got, expected) and torch.equal(mine.get_state(), theirs.get_state())
    return _agrees
