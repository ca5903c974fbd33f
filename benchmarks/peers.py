"""hfbridge's samplers side by side with text-generation-webui's (the processors its users run).

    git -C TGW_CHECKOUT show HEAD:modules/sampler_hijack.py > /tmp/tgw_sampler_hijack.py
    python benchmarks/peers.py --tgw /tmp/tgw_sampler_hijack.py             # every case, 9 rounds
    python benchmarks/peers.py --tgw /tmp/tgw_sampler_hijack.py --quick     # 3 rounds

text-generation-webui's classes are read from that file at run time (its `DRYLogitsProcessor`,
`PresencePenaltyLogitsProcessor`, `FrequencyPenaltyLogitsProcessor`, `DynamicTemperatureLogitsWarper`):
nothing of it is copied here. Method: one thread, `time.thread_time()`, the implementations round-robin
on the same inputs, medians. Text-generation-webui's processors write into the scores they get, so each of
its calls gets a copy made outside the timer. hfbridge's are timed as hfbridge runs them, on the step's own
float32 copy (made outside the timer too: a `Sampler` makes it whatever the chain holds), inside
`owned_scores()`, where they may write into it; the "standalone" column is the processor called as
transformers calls it, leaving its input alone and paying for its own output tensor. Before timing,
the outputs are compared: equal values (DRY: a history without breakers and with repeats shorter than
text-generation-webui's cap of 50, where both definitions agree).
"""

from __future__ import annotations

import argparse
import ast
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import LogitsProcessor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))
from samplers import history, realistic

from hfbridge.processors import (
    DRYLogitsProcessor,
    DynamicTemperatureLogitsWarper,
    PresenceFrequencyPenaltyLogitsProcessor,
)
from hfbridge.processors._host import owned_scores

TGW_CLASSES = ("DRYLogitsProcessor", "PresencePenaltyLogitsProcessor", "FrequencyPenaltyLogitsProcessor",
               "DynamicTemperatureLogitsWarper")


def load_tgw(path: str) -> dict[str, type]:
    """text-generation-webui's processor classes, executed from its `modules/sampler_hijack.py`."""
    tree = ast.parse(Path(path).read_text())
    wanted = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in TGW_CLASSES]
    namespace: dict = {"torch": torch, "math": math, "LogitsProcessor": LogitsProcessor}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), path, "exec"), namespace)
    return {name: namespace[name] for name in TGW_CLASSES}


def timed(call) -> float:
    start = time.thread_time()
    call()
    return time.thread_time() - start


def race(runs: dict, rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (prepare, call) in runs.items():
            argument = prepare()
            times[name].append(timed(lambda: call(argument)))
    return {name: statistics.median(values) for name, values in times.items()}


def owned(call):
    """`call` as hfbridge's `Sampler` runs it: on scores that are the step's own copy."""
    def run(scores):
        with owned_scores():
            return call(scores)
    return run


def no_breakers_history(rows: int, length: int, vocab: int, breakers: set[int], generator) -> torch.Tensor:
    ids = history(rows, length, vocab, generator)
    for token in breakers:  # no breaker inside: both definitions then agree
        ids[ids == token] = (token + 1) % vocab
    return ids


def dry_cases(tgw: dict, rounds: int) -> list[str]:
    lines = ["| DRY: B | V | context | hfbridge ms | standalone ms | TGW ms | TGW / hfbridge | values equal |",
             "|---:|---:|---:|---:|---:|---:|---:|---|"]
    breakers = {13, 198}
    for rows, vocab in [(1, 32000), (8, 50257), (32, 128256)]:
        for length in (256, 2048):
            generator = torch.Generator().manual_seed(rows * length)
            scores = realistic(rows, vocab, generator)
            ids = no_breakers_history(rows, length, vocab, breakers, generator)
            ours = DRYLogitsProcessor(0.8, 1.75, 2, -1, sequence_breakers=[[b] for b in sorted(breakers)])
            theirs = tgw["DRYLogitsProcessor"](0.8, 1.75, 2, breakers, 0)
            expected = theirs(ids, scores.clone())
            equal = bool(torch.equal(ours(ids, scores), expected))
            median = race({"hfbridge": (lambda: scores.clone(), owned(lambda s: ours(ids, s))),
                           "standalone": (lambda: scores, lambda s: ours(ids, s)),
                           "tgw": (lambda: scores.clone(), lambda s: theirs(ids, s))}, rounds)
            lines.append(f"| {rows} | {vocab} | {length} | {median['hfbridge'] * 1e3:.3f} | "
                         f"{median['standalone'] * 1e3:.3f} | {median['tgw'] * 1e3:.3f} "
                         f"| {median['tgw'] / median['hfbridge']:.2f} | {equal} |")
    return lines


def penalty_cases(tgw: dict, rounds: int) -> list[str]:
    lines = ["| presence + frequency: B | V | hfbridge ms | TGW ms | TGW / hfbridge | values equal |",
             "|---:|---:|---:|---:|---:|---|"]
    for rows, vocab in [(1, 32000), (8, 50257), (32, 128256)]:
        generator = torch.Generator().manual_seed(rows)
        scores = realistic(rows, vocab, generator)
        ids = history(rows, 1024, vocab, generator)
        ours = PresenceFrequencyPenaltyLogitsProcessor(0.5, 0.5, 1024)
        presence, frequency = tgw["PresencePenaltyLogitsProcessor"](0.5, 1024), tgw["FrequencyPenaltyLogitsProcessor"](
            0.5, 1024)

        def both(s):
            return frequency(ids, presence(ids, s))

        equal = bool(torch.allclose(ours(ids, scores), both(scores.clone()), rtol=0, atol=1e-5))
        median = race({"hfbridge": (lambda: scores.clone(), owned(lambda s: ours(ids, s))),
                       "tgw": (lambda: scores.clone(), both)}, rounds)
        lines.append(f"| {rows} | {vocab} | {median['hfbridge'] * 1e3:.3f} | {median['tgw'] * 1e3:.3f} "
                     f"| {median['tgw'] / median['hfbridge']:.2f} | {equal} |")
    return lines


def dynatemp_cases(tgw: dict, rounds: int) -> list[str]:
    lines = ["| dynamic temperature: B | V | hfbridge ms | TGW ms | TGW / hfbridge | values equal |",
             "|---:|---:|---:|---:|---:|---|"]
    for rows, vocab in [(1, 32000), (1, 128256)]:  # TGW's takes one entropy for the whole batch: B=1 only
        scores = realistic(rows, vocab, torch.Generator().manual_seed(vocab))
        ours = DynamicTemperatureLogitsWarper(0.8, 0.5)
        theirs = tgw["DynamicTemperatureLogitsWarper"](0.3, 1.3, 1.0)
        equal = bool(torch.allclose(ours(None, scores), theirs(None, scores.clone()), rtol=1e-5, atol=1e-5))
        median = race({"hfbridge": (lambda: scores.clone(), owned(lambda s: ours(None, s))),
                       "tgw": (lambda: scores.clone(), lambda s: theirs(None, s))}, rounds)
        lines.append(f"| {rows} | {vocab} | {median['hfbridge'] * 1e3:.3f} | {median['tgw'] * 1e3:.3f} "
                     f"| {median['tgw'] / median['hfbridge']:.2f} | {equal} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tgw", required=True, help="text-generation-webui's modules/sampler_hijack.py")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["dry", "penalties", "dynatemp"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    rounds = 3 if args.quick else args.rounds
    tgw = load_tgw(args.tgw)
    print(f"one thread, thread CPU time, median of {rounds} round-robin rounds; torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}\n")
    for name, section in (("dry", dry_cases), ("penalties", penalty_cases), ("dynatemp", dynatemp_cases)):
        if args.only in (None, name):
            print("\n".join(section(tgw, rounds)) + "\n")


if __name__ == "__main__":
    main()
