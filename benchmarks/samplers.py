"""The cost of each sampler of `hfbridge.processors`, in units of one read of the logits (`amax`).

    python benchmarks/samplers.py               # B=32, V=128256, 1,024 tokens of history, 7 rounds
    python benchmarks/samplers.py --repeats 15  # more rounds
    python benchmarks/samplers.py --quick       # B=8, V=32000, 3 rounds (a smoke run)

Method: one thread (`torch.set_num_threads(1)`), each call timed with `time.thread_time()` (this
thread's CPU time), every sampler and the floor (`logits.amax(-1)`) run round-robin on the same
realistic logits (log-probability ~ -1.1 log(rank), permuted per row) and history; each number is
the median over the rounds. A sampler's added cost is its own call; dynamic temperature replaces
HF's `TemperatureLogitsWarper`, so its added cost is the difference. Two columns: "standalone" is
the processor called as transformers calls it (it leaves its input alone and pays for its output
tensor), "in a Sampler" the same call inside `owned_scores()` on a copy made outside the timer, as
hfbridge's `Sampler` runs it on the step's own float32 copy (it may write into it). Targets: each
<= 8 units, and at most HF's `TopKLogitsWarper(50)` in the same run. The stateful ones (mirostat 1
and 2, adaptive-p, the thinking budget) are timed on their update path (the call after a step,
reading the token chosen). The machine line gives the cost of one fresh `(B, V)` float32 tensor
written once (`torch.empty_like(...).fill_(1.0)`: page faults on new memory) and of the same write
into a reused one, in the same units.

Then mirostat's whole step: `Sampler(do_sample=True, mirostat=m, top_k=0)` in exact mode (HF's
draw: `softmax`, `torch.multinomial`'s tokens and random stream) and with `fast=True`, target
exact / fast <= 2.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from hfbridge import Sampler
from hfbridge.processors import (
    AdaptivePLogitsWarper,
    DRYLogitsProcessor,
    DynamicTemperatureLogitsWarper,
    MirostatLogitsWarper,
    MirostatV1LogitsWarper,
    PresenceFrequencyPenaltyLogitsProcessor,
    SmoothingLogitsWarper,
    ThinkingBudgetLogitsProcessor,
    TopNSigmaLogitsWarper,
    XTCLogitsWarper,
)
from hfbridge.processors._cpu_side import owned_scores

TARGET = 8.0


def realistic(rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    rank = torch.arange(1, vocab + 1, dtype=torch.float32)
    base = -1.1 * rank.log()  # [V]
    order = torch.argsort(torch.rand(rows, vocab, generator=generator), dim=-1)
    return base[order] + 0.1 * torch.randn(rows, vocab, generator=generator)  # [B, V]


def history(rows: int, length: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    # phrases of 4-12 tokens drawn from a 2,000-token pool, some of them repeated: DRY finds repeats
    out = torch.empty(rows, length, dtype=torch.long)
    pool = torch.randint(0, vocab, (2000,), generator=generator)
    for row in range(rows):
        tokens: list[int] = []
        phrases: list[list[int]] = []
        while len(tokens) < length:
            if phrases and torch.rand((), generator=generator) < 0.3:
                phrase = phrases[int(torch.randint(0, len(phrases), (), generator=generator))]
            else:
                size = int(torch.randint(4, 13, (), generator=generator))
                phrase = pool[torch.randint(0, 2000, (size,), generator=generator)].tolist()
                phrases.append(phrase)
            tokens += phrase
        out[row] = torch.tensor(tokens[:length])
    return out


def samplers(prompt: int) -> dict[str, tuple]:
    """name -> (processor factory, baseline factory or None)."""
    return {
        "DRY (multiplier 0.8, 3 token breakers)": (
            lambda: DRYLogitsProcessor(0.8, sequence_breakers=[[13], [198], [25, 26]]), None),
        "XTC (threshold 0.1, probability 1.0)": (lambda: XTCLogitsWarper(0.1, 1.0), None),
        "top-n-sigma (n 1.0)": (lambda: TopNSigmaLogitsWarper(1.0), None),
        "presence/frequency (generated tokens)": (
            lambda: PresenceFrequencyPenaltyLogitsProcessor(0.5, 0.5, prompt_length=prompt), None),
        "presence/frequency + repetition (penalty_last_n 64)": (
            lambda: PresenceFrequencyPenaltyLogitsProcessor(0.5, 0.5, 64, repetition_penalty=1.1), None),
        "dynamic temperature (0.8 +- 0.5) - temperature": (
            lambda: DynamicTemperatureLogitsWarper(0.8, 0.5), lambda: TemperatureLogitsWarper(0.8)),
        "smoothing (factor 0.3, curve 1)": (lambda: SmoothingLogitsWarper(0.3), None),
        "smoothing (factor 0.3, curve 2)": (lambda: SmoothingLogitsWarper(0.3, 2.0), None),
        "mirostat 2 (tau 5, eta 0.1)": (lambda: MirostatLogitsWarper(5.0, 0.1), None),
        "mirostat 1 (tau 5, eta 0.1, m 100)": (lambda: MirostatV1LogitsWarper(5.0, 0.1, 100), None),
        "adaptive-p (target 0.3, decay 0.9)": (lambda: AdaptivePLogitsWarper(0.3, 0.9), None),
        "thinking budget (counting)": (lambda: ThinkingBudgetLogitsProcessor(10**6, [0], [1], prompt_length=0), None),
    }


# transformers' own warpers on the same logits, for comparison (not targets)
HF_WARPERS = {
    "HF TopKLogitsWarper(50)": lambda: TopKLogitsWarper(50),
    "HF MinPLogitsWarper(0.05)": lambda: MinPLogitsWarper(0.05),
    "HF TopPLogitsWarper(0.9)": lambda: TopPLogitsWarper(0.9),
}


def timed(function) -> float:
    start = time.thread_time()
    function()
    return time.thread_time() - start


def machine_costs(scores: torch.Tensor, repeats: int) -> tuple[float, float, float]:
    """Medians (seconds) of one amax, one fresh tensor written once, the same write into a reused one."""
    reused = torch.empty_like(scores)
    times: list[list[float]] = [[], [], []]
    for _ in range(repeats):
        times[0].append(timed(lambda: scores.amax(-1)))
        times[1].append(timed(lambda: torch.empty_like(scores).fill_(1.0)))
        times[2].append(timed(lambda: reused.fill_(1.0)))
    return tuple(statistics.median(values) for values in times)  # type: ignore[return-value]


def mirostat_steps(scores: torch.Tensor, ids: torch.Tensor, repeats: int) -> list[str]:
    """Exact against fast, the whole step (`Sampler.__call__`), round-robin."""
    samplers = {(version, fast): Sampler(do_sample=True, mirostat=version, top_k=0, fast=fast)
                for version in (2, 1) for fast in (False, True)}
    for sampler in samplers.values():
        sampler(scores, ids)  # warm up
    times: dict = {key: [] for key in samplers}
    for _ in range(repeats):
        for key, sampler in samplers.items():
            times[key].append(timed(lambda: sampler(scores, ids)))
    lines = ["| mirostat | exact ms | fast ms | exact / fast | target <= 2 |", "|---|---:|---:|---:|---|"]
    for version in (2, 1):
        exact, fast = (statistics.median(times[(version, f)]) for f in (False, True))
        lines.append(f"| {version} | {exact * 1e3:.3f} | {fast * 1e3:.3f} | {exact / fast:.2f} | "
                     f"{'PASS' if exact <= 2 * fast else 'MISS'} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, vocab, length = (8, 32000, 256) if args.quick else (32, 128256, 1024)
    repeats = 3 if args.quick else args.repeats
    generator = torch.Generator().manual_seed(0)
    scores = realistic(rows, vocab, generator)
    ids = history(rows, length, vocab, generator)
    prompt = length // 2
    table = samplers(prompt)
    built = {name: (make(), base() if base else None) for name, (make, base) in table.items()}
    built.update({name: (make(), None) for name, make in HF_WARPERS.items()})
    times: dict[str, list[float]] = {name: [] for name in ["amax", *built]}
    owned: dict[str, list[float]] = {name: [] for name in built}
    copy = scores.clone()
    for processor, _ in built.values():  # warm up
        processor(ids, scores)
    order = random.Random(0)
    for _ in range(repeats):
        times["amax"].append(timed(lambda: scores.amax(-1)))
        # a new order each round: whichever runs right after HF's top-p (whose sort frees hundreds of MB, which
        # glibc hands back to the system) pays for fresh pages for its output; a fixed or rotated order would
        # always put the same sampler there (DRY, standalone: 11 units after it, 2 elsewhere)
        for name in order.sample(list(built), len(built)):
            processor, baseline = built[name]
            for column in (times, owned):
                if hasattr(processor, "reset"):  # stateful
                    processor.reset()
                    processor(ids[:, :-1], scores)  # the step before: the timed call updates mu from ids[:, -1]
                if column is owned:
                    copy.copy_(scores)
                    with owned_scores():
                        cost = timed(lambda: processor(ids, copy))
                else:
                    cost = timed(lambda: processor(ids, scores))
                if baseline is not None:
                    cost -= timed(lambda: baseline(ids, scores))
                column[name].append(cost)
    floor = statistics.median(times["amax"])
    top_k = statistics.median(times["HF TopKLogitsWarper(50)"])
    amax, fresh, reused = machine_costs(scores, repeats)
    print(f"B={rows}, V={vocab}, {length} tokens of history; one thread, thread CPU time, median of {repeats} "
          f"round-robin rounds; torch {torch.__version__}, {platform.processor() or platform.machine()}")
    print(f"floor: one amax over the logits = {floor * 1e3:.3f} ms; machine: one fresh ({rows}, {vocab}) float32 "
          f"tensor written once = {fresh / amax:.1f} amax, the same write into a reused one = {reused / amax:.1f}\n")
    print(f"| sampler | standalone ms | amax units | in a Sampler, units | target <= {TARGET:g} "
          "| <= HF's top-k (50) |")
    print("|---|---:|---:|---:|---|---|")
    for name in built:
        cost = statistics.median(times[name])
        units = cost / floor
        inside = statistics.median(owned[name]) / floor
        if name in table:
            verdict = "PASS" if units <= TARGET else "MISS"
            versus = "PASS" if cost <= top_k else "MISS"
        else:
            verdict = versus = "(for comparison)"
        print(f"| {name} | {cost * 1e3:.3f} | {units:.1f} | {inside:.1f} | {verdict} | {versus} |")
    print()
    print("\n".join(mirostat_steps(scores, ids[:, -64:], repeats)))


if __name__ == "__main__":
    main()
