"""Phase-aware sampling (`thinking_options`) vs one phase: one step, B=8, V=32000, one thread.

    python benchmarks/thinking_options.py               # 9 repeats
    python benchmarks/thinking_options.py --repeats 15

The samplers, built once: `plain` (temperature=0.8, top_p=0.9, top_k=0, no phases), `phased, all answering`
(the same options with `thinking_options={"temperature": 1.2}`, no row thinking: one sampler runs, the phases
read once), `phased, split` (half the rows thinking: each phase's sampler on its rows), and the greedy pair
`greedy` / `greedy, penalty` (repetition_penalty=1.3 for every row) / `greedy phased` (repetition_penalty=1.3
while thinking; every phase greedy: both run on every row, no host read). Each step runs on the same logits and
ids (256 tokens of context).

Method: one thread, each call timed with `time.thread_time()`; within a repeat the samplers run round-robin;
each number is the median of the repeats, beside its ratio to the one-phase baseline of the same kind.
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

from hfbridge import Sampler  # noqa: E402

B, V, T = 8, 32000, 256
TAGS = dict(thinking_start=[7], thinking_end=[8])


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, V, generator=g) * 3
    answering = torch.randint(10, V, (B, T), generator=g)  # no tag: every row answering
    split = answering.clone()
    split[: B // 2, 5] = 7  # half the rows opened a span
    return logits, answering, split


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    logits, answering, split = _inputs()
    sampled = dict(temperature=0.8, top_p=0.9, top_k=0)
    runs = {
        "plain": (Sampler(**sampled, **TAGS), answering),
        "phased, all answering": (Sampler(**sampled, thinking_options={"temperature": 1.2}, **TAGS), answering),
        "phased, split": (Sampler(**sampled, thinking_options={"temperature": 1.2}, **TAGS), split),
        "greedy": (Sampler(**TAGS), split),
        "greedy, penalty": (Sampler(repetition_penalty=1.3, **TAGS), split),
        "greedy phased": (Sampler(thinking_options={"repetition_penalty": 1.3}, **TAGS), split),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for sampler, ids in runs.values():  # warm up
        sampler.step(ids, logits)
    for _ in range(args.repeats):
        for name, (sampler, ids) in runs.items():
            start = time.thread_time()
            for _ in range(5):
                sampler.step(ids, logits)
            times[name].append((time.thread_time() - start) / 5)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"B={B} V={V} T={T}, one thread, median of {args.repeats} repeats (5 steps each)")
    for name, median in medians.items():
        base = medians["greedy" if name.startswith("greedy") else "plain"]
        print(f"{name:<24} {median * 1e3:8.3f} ms  x{median / base:.2f}")


if __name__ == "__main__":
    main()
