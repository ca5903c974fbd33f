"""Per-step sampling time: the hand-written HF chain vs hfbridge exact vs hfbridge `fast=True`.

    python benchmarks/step.py            # full table, CPU (and CUDA when present)
    python benchmarks/step.py --quick    # two sizes, fewer repeats
    python benchmarks/step.py --one-shot # time sample_step(...) itself (rebuilds processors per call)

Each cell runs the three implementations round-robin on the same logits (so load on a shared
machine hits them alike) and reports the median of the repeats. The HF chain is what users write
today: `LogitsProcessorList` of HF's own processors, built once, then `softmax` +
`torch.multinomial` (or `argmax` for greedy); hfbridge's side is a `Sampler` built once (what
`generate` uses; `sample_step` is a one-shot `Sampler`). Logits are either flat (standard normal)
or realistic: log-probability proportional to -1.1 * log(rank), randomly permuted per row, plus
N(0, 0.1) noise.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from hfbridge import Sampler, sample_step

SIZES = [(1, 32000), (8, 50257), (32, 128256)]
QUICK_SIZES = [(1, 32000), (32, 128256)]
PROMPT = 64  # tokens of context per row (the repetition penalty reads them)

# name -> (HF processors, sample_step options); top_k=0 where HF's default top_k=50 must stay off.
CONFIGS = {
    "greedy": (list, dict(do_sample=False)),
    "temp+top-k": (lambda: [TemperatureLogitsWarper(0.7), TopKLogitsWarper(50)],
                   dict(do_sample=True, temperature=0.7, top_k=50)),
    "temp+top-p": (lambda: [TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)],
                   dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0)),
    "rep+temp+top-k+top-p": (
        lambda: [RepetitionPenaltyLogitsProcessor(1.2), TemperatureLogitsWarper(0.7), TopKLogitsWarper(50),
                 TopPLogitsWarper(0.9)],
        dict(do_sample=True, repetition_penalty=1.2, temperature=0.7, top_k=50, top_p=0.9)),
    "min-p": (lambda: [TemperatureLogitsWarper(0.7), MinPLogitsWarper(0.05)],
              dict(do_sample=True, temperature=0.7, min_p=0.05, top_k=0)),
}


def make_logits(kind: str, batch: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """`(batch, vocab)` float32 logits, flat or Zipf-like."""
    if kind == "flat":
        return torch.randn(batch, vocab, generator=generator)
    log_rank = torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))  # [V]
    rows = [-1.1 * log_rank[torch.randperm(vocab, generator=generator)] for _ in range(batch)]
    return torch.stack(rows) + 0.1 * torch.randn(batch, vocab, generator=generator)


def hf_chain(processors: LogitsProcessorList, do_sample: bool, generator: torch.Generator):
    def step(logits, input_ids):
        if not do_sample:
            return processors(input_ids, logits).argmax(dim=-1)
        probs = torch.softmax(processors(input_ids, logits), dim=-1)
        return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)
    return step


def bridge(options: dict, generator: torch.Generator, fast: bool, one_shot: bool):
    if one_shot:  # sample_step: builds its processors on every call
        return lambda logits, input_ids: sample_step(logits, input_ids, generator=generator, fast=fast, **options)
    return Sampler(generator=generator, fast=fast, **options)  # built once, like the HF chain's processors


def measure(steps: dict, logits, input_ids, repeats: int, sync) -> dict:
    """Median seconds per call of each step, run round-robin `repeats` times after a warm-up."""
    times = {name: [] for name in steps}
    for step in steps.values():
        step(logits, input_ids)
    sync()
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step(logits, input_ids)
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def run(device: str, sizes, repeats: int, configs, one_shot: bool) -> None:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(0)
    what = "sample_step (one-shot)" if one_shot else "a Sampler built once"
    print(f"\n### {device}: {describe(device)}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {repeats}; exact/fast = {what}\n")
    print("| B | V | logits | config | HF chain ms | exact ms | fast ms | exact / HF | HF / fast |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for batch, vocab in sizes:
        input_ids = torch.randint(0, vocab, (batch, PROMPT), generator=generator).to(device)
        for kind in ("flat", "realistic"):
            logits = make_logits(kind, batch, vocab, generator).to(device)
            for name in configs:
                make, options = CONFIGS[name]
                draw = torch.Generator(device=device).manual_seed(1)
                steps = {
                    "hf": hf_chain(LogitsProcessorList(make()), options["do_sample"], draw),
                    "exact": bridge(options, draw, fast=False, one_shot=one_shot),
                }
                if options["do_sample"]:
                    steps["fast"] = bridge(options, draw, fast=True, one_shot=one_shot)
                t = measure(steps, logits, input_ids, repeats, sync)
                fast = f"{t['fast'] * 1e3:.2f}" if "fast" in t else "-"
                speedup = f"{t['hf'] / t['fast']:.1f}x" if "fast" in t else "-"
                print(f"| {batch} | {vocab} | {kind} | {name} | {t['hf'] * 1e3:.2f} | {t['exact'] * 1e3:.2f} | "
                      f"{fast} | {t['exact'] / t['hf']:.2f} | {speedup} |", flush=True)


def describe(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two sizes, 3 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per cell (default 7, quick 3)")
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--config", action="append", choices=list(CONFIGS), help="only these configs")
    parser.add_argument("--one-shot", action="store_true",
                        help="time sample_step(...) itself, which rebuilds its processors on every call "
                             "(default: a Sampler built once, as the HF chain's processors are)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    repeats = args.repeats or (3 if args.quick else 7)
    sizes = QUICK_SIZES if args.quick else SIZES
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    for device in devices:
        if device == "cuda" and not torch.cuda.is_available():
            continue
        run(device, sizes, repeats, args.config or list(CONFIGS), args.one_shot)


if __name__ == "__main__":
    main()
