"""Realistic logits for the fast-path tests: Zipf-like rows, as `benchmarks/step.py` makes them."""

from __future__ import annotations

import torch


def zipf(batch: int, vocab: int, seed: int, exponent: float = 1.1) -> torch.Tensor:
    """`(batch, vocab)` float32: log-probability -exponent * log(rank), ranks permuted per row, plus
    N(0, 0.1) noise; the same rows for the same seed."""
    g = torch.Generator().manual_seed(seed)
    log_rank = torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
    rows = [-exponent * log_rank[torch.randperm(vocab, generator=g)] for _ in range(batch)]
    return torch.stack(rows) + 0.1 * torch.randn(batch, vocab, generator=g)
