"""Per-row options vs the same values as scalars: one sampling step, B=32, V=128256, top-p 0.9 at T 0.8.

    python benchmarks/per_row.py               # exact and fast, 9 repeats
    python benchmarks/per_row.py --repeats 15

The samplers, built once per mode: `scalar` (temperature=0.8, top_p=0.9, top_k=0: HF's default
top_k=50 off, as in step.py's "temp+top-p"), `same` (the same values
given per row, 32 equal ones: one group) and `distinct` (32 different values per row around
them: in exact mode 32 groups, HF's processors once per group, the temperature one division for the
batch; in fast mode one draw with a `(32, 1)` temperature and a `(32, 1)` top-p),
`temps` (32 distinct temperatures, top_p=0.9 in every row: one division, then one top-p for the batch),
`close` (32 distinct temperatures within 0.0003 of 0.8: the per-row machinery alone, the same
distributions), and `hottest` (scalars at the flattest row's values: a fast batch costs what its
flattest row costs, so spread-out values cost that much even without any per-row machinery), and in
fast mode `loop` (32 scalar `Sampler`s, one per row with `distinct`'s values, each on its own row).
Target: per-row values at most 15% over `scalar` in both modes, and `distinct` faster than `loop`.

Method: one thread, each call timed with `time.thread_time()`; within a repeat the samplers
run round-robin on the same logits; each number is the median of the repeats. Host reads per
step are counted with tests/_host_reads.py's `HostReads` (they must not grow with per-row values).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "tests"))
from _host_reads import HostReads  # noqa: E402

from hfbridge import Sampler  # noqa: E402

B, V = 32, 128256


def _logits() -> torch.Tensor:
    """Zipf-like rows: log-probability -1.1 * log(rank), permuted per row, plus a little noise."""
    g = torch.Generator().manual_seed(0)
    ranks = torch.arange(1, V + 1, dtype=torch.float32)
    base = -1.1 * ranks.log()
    rows = torch.stack([base[torch.randperm(V, generator=g)] for _ in range(B)])
    return rows + 0.1 * torch.randn(B, V, generator=g)


def samplers(fast: bool) -> dict[str, Sampler | _Loop]:
    distinct_t = [0.8 + 0.005 * (i - B // 2) for i in range(B)]
    distinct_p = [0.9 + 0.002 * (i - B // 2) for i in range(B)]
    return {
        "scalar": Sampler(temperature=0.8, top_p=0.9, top_k=0, fast=fast),
        "same": Sampler(temperature=[0.8] * B, top_p=[0.9] * B, top_k=0, fast=fast),
        "distinct": Sampler(temperature=distinct_t, top_p=distinct_p, top_k=0, fast=fast),
        "temps": Sampler(temperature=distinct_t, top_p=0.9, top_k=0, fast=fast),
        "close": Sampler(temperature=[0.8 + 1e-5 * i for i in range(B)], top_p=0.9, top_k=0, fast=fast),
        "hottest": Sampler(temperature=max(distinct_t), top_p=max(distinct_p), top_k=0, fast=fast),
        **({"loop": _Loop(distinct_t, distinct_p, fast)} if fast else {}),
    }


class _Loop:
    """32 scalar `Sampler`s, one per row with that row's values, each called on its own row: what a
    caller would write without per-row options (fast mode only)."""

    def __init__(self, temperatures: list[float], top_ps: list[float], fast: bool) -> None:
        self.samplers = [Sampler(temperature=t, top_p=p, top_k=0, fast=fast) for t, p in zip(temperatures, top_ps)]

    def __call__(self, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([sampler(logits[i:i + 1], ids[i:i + 1]) for i, sampler in enumerate(self.samplers)])


def run(repeats: int) -> None:
    torch.set_num_threads(1)
    logits = _logits()
    ids = torch.zeros(B, 1, dtype=torch.long)
    print(f"B={B} V={V} top_p=0.9 T=0.8, one thread, thread time, median of {repeats} (ms)")
    for fast in (False, True):
        table = samplers(fast)
        times: dict[str, list[float]] = {name: [] for name in table}
        for sampler in table.values():
            sampler(logits, ids)  # warm up
        for _ in range(repeats):
            for name, sampler in table.items():
                start = time.thread_time()
                sampler(logits, ids)
                times[name].append(time.thread_time() - start)
        reads = {}
        for name, sampler in table.items():
            with HostReads() as counter:
                sampler(logits, ids)
            reads[name] = counter.count
        base = statistics.median(times["scalar"])
        mode = "fast" if fast else "exact"
        for name, values in times.items():
            median = statistics.median(values)
            verdict = "" if name in ("scalar", "hottest", "loop") else ("PASS" if median <= 1.15 * base else "MISS")
            print(f"{mode:5} {name:8} {1000 * median:8.2f} ms  x{median / base:5.3f}  host reads {reads[name]:3d}  "
                  f"{verdict}")
        if "loop" in times:  # per-row fast must beat the loop of scalar samplers it replaces
            loop = statistics.median(times["loop"])
            for name in ("distinct", "temps"):
                ratio = loop / statistics.median(times[name])
                print(f"{mode:5} loop / {name}: {ratio:5.2f}  {'PASS' if ratio > 1 else 'MISS'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    run(parser.parse_args().repeats)
