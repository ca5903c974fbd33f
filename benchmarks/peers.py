"""hfbridge's samplers side by side with text-generation-webui's (the processors its users run) and llama.cpp's.

    git -C TGW_CHECKOUT show HEAD:modules/sampler_hijack.py > /tmp/tgw_sampler_hijack.py
    python benchmarks/peers.py --tgw /tmp/tgw_sampler_hijack.py             # every case, 9 rounds
    python benchmarks/peers.py --tgw /tmp/tgw_sampler_hijack.py --quick     # 3 rounds
    python benchmarks/peers.py --only chain                                 # llama.cpp's chain alone
    python benchmarks/peers.py --only chain-cold                            # the chain's step, cold every time

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

llama.cpp's C samplers (llama-cpp-python, optional: without it the script says so and skips them) run
through its low-level bindings without a model (`_peers_llama.py`): one chain per row, as llama.cpp
samples each sequence, timed as the loop of `llama_sampler_apply` calls over the rows; filling each
row's `llama_token_data_array` from the logits is done before the timer. They add a llama.cpp column to
the DRY (no sequence breakers: llama.cpp needs a model's vocabulary to turn breaker strings into tokens;
values equal within 1e-5, as llama.cpp computes DRY's penalty in float32)
and penalty tables, and a table of their own, the full llama.cpp-style chain (repetition 1.1, presence
and frequency 0.5 over the last 64 tokens, DRY 0.8, top-k 40, top-p 0.95, min-p 0.05, temperature 0.8,
the draw) against hfbridge's `Sampler(fast=True)` with the same options, whole step included (its
float32 copy and its draw). Agreement: hfbridge's processors put in llama.cpp's order (penalties, DRY,
top-k, top-p, min-p, temperature; HF's order puts the temperature first) keep the same tokens with the
same values as llama.cpp's chain without its draw, and every token the fast `Sampler` draws is one HF's
chain (its order) keeps.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import LogitsProcessor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _peers_llama import Chain, agree, available, kept_of
from samplers import history, realistic
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hfbridge import Sampler, accelerator_route
from hfbridge.processors import (
    DRYLogitsProcessor,
    DynamicTemperatureLogitsWarper,
    PresenceFrequencyPenaltyLogitsProcessor,
)
from hfbridge.processors._cpu_side import owned_scores, scores_owned

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
    """Medians of `rounds` rounds; the order rotates from round to round, so that no implementation always
    runs first, right after the previous round's last one has filled the caches with its own data."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for number in range(rounds):
        for name in names[number % len(names):] + names[: number % len(names)]:
            prepare, call = runs[name]
            argument = prepare()
            # `owned` calls: the context is entered outside the timer, as a `Sampler` enters it once a step
            with owned_scores() if getattr(call, "owned", False) else contextlib.nullcontext():
                times[name].append(timed(lambda: call(argument)))
    return {name: statistics.median(values) for name, values in times.items()}


def owned(call):
    """`call` as hfbridge's `Sampler` runs it: on scores that are the step's own copy (`owned_scores()`,
    which a `Sampler` enters once a step around its whole chain: `race` enters it outside the timer)."""
    def run(scores):
        if scores_owned():
            return call(scores)
        with owned_scores():
            return call(scores)
    run.owned = True  # type: ignore[attr-defined]
    return run


def no_breakers_history(rows: int, length: int, vocab: int, breakers: set[int], generator) -> torch.Tensor:
    ids = history(rows, length, vocab, generator)
    for token in breakers:  # no breaker inside: both definitions then agree
        ids[ids == token] = (token + 1) % vocab
    return ids


def llama_run(chain: Chain, scores: torch.Tensor) -> tuple:
    """llama.cpp's loop over the rows, its arrays filled from `scores` before the timer."""
    return lambda: chain.rows(scores), chain.apply


def llama_case(chain: Chain, scores: torch.Tensor, expected: torch.Tensor) -> tuple[bool, tuple]:
    """Whether llama.cpp's chain gives `expected` (within 1e-5: it computes its penalties in float32), and its
    run for `race`."""
    done = chain.rows(scores)
    chain.apply(done)
    return bool(torch.allclose(expected, done.dense(), rtol=0, atol=1e-5)), llama_run(chain, scores)


def peer_cells(median: dict[str, float], equal: dict[str, bool], peers: list[str]) -> str:
    """Each peer's milliseconds, its time over hfbridge's and whether its values agree, as table cells."""
    return " | ".join(f"{median[name] * 1e3:.3f} | {median[name] / median['hfbridge']:.2f} | {equal[name]}"
                      for name in peers)


def dry_cases(tgw: dict | None, rounds: int, llama: bool) -> list[str]:
    peers = (["tgw"] if tgw else []) + (["llama.cpp"] if llama else [])
    head = "".join(f" {name} ms | {name} / hfbridge | values equal ({name}) |" for name in peers)
    lines = ["| DRY: B | V | context | hfbridge ms | standalone ms |" + head,
             "|---:|---:|---:|---:|---:|" + "---:|---:|---|" * len(peers)]
    breakers = {13, 198}
    for rows, vocab in [(1, 32000), (8, 50257), (32, 128256)]:
        for length in (256, 2048):
            generator = torch.Generator().manual_seed(rows * length)
            scores = realistic(rows, vocab, generator)
            ids = no_breakers_history(rows, length, vocab, breakers, generator)
            ours = DRYLogitsProcessor(0.8, 1.75, 2, -1, sequence_breakers=[[b] for b in sorted(breakers)])
            expected = ours(ids, scores)
            runs = {"hfbridge": (lambda: scores.clone(), owned(lambda s: ours(ids, s))),
                    "standalone": (lambda: scores, lambda s: ours(ids, s))}
            equal = {}
            if tgw:
                theirs = tgw["DRYLogitsProcessor"](0.8, 1.75, 2, breakers, 0)
                equal["tgw"] = bool(torch.equal(expected, theirs(ids, scores.clone())))
                runs["tgw"] = (lambda: scores.clone(), lambda s: theirs(ids, s))
            if llama:  # no breakers (they need a vocabulary): the history holds none anyway
                chain = Chain(rows, ids, dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_last_n=length)
                equal["llama.cpp"], runs["llama.cpp"] = llama_case(chain, scores, expected)
            median = race(runs, rounds)
            lines.append(f"| {rows} | {vocab} | {length} | {median['hfbridge'] * 1e3:.3f} | "
                         f"{median['standalone'] * 1e3:.3f} | {peer_cells(median, equal, peers)} |")
    return lines


def penalty_cases(tgw: dict | None, rounds: int, llama: bool) -> list[str]:
    peers = (["tgw"] if tgw else []) + (["llama.cpp"] if llama else [])
    head = "".join(f" {name} ms | {name} / hfbridge | values equal ({name}) |" for name in peers)
    lines = ["| presence + frequency (last 1024): B | V | hfbridge ms |" + head,
             "|---:|---:|---:|" + "---:|---:|---|" * len(peers)]
    for rows, vocab in [(1, 32000), (8, 50257), (32, 128256)]:
        generator = torch.Generator().manual_seed(rows)
        scores = realistic(rows, vocab, generator)
        ids = history(rows, 1024, vocab, generator)
        ours = PresenceFrequencyPenaltyLogitsProcessor(0.5, 0.5, 1024)
        expected = ours(ids, scores)
        runs = {"hfbridge": (lambda: scores.clone(), owned(lambda s: ours(ids, s)))}
        equal = {}
        if tgw:
            presence = tgw["PresencePenaltyLogitsProcessor"](0.5, 1024)
            frequency = tgw["FrequencyPenaltyLogitsProcessor"](0.5, 1024)

            def both(s, presence=presence, frequency=frequency):
                return frequency(ids, presence(ids, s))

            equal["tgw"] = bool(torch.allclose(expected, both(scores.clone()), rtol=0, atol=1e-5))
            runs["tgw"] = (lambda: scores.clone(), both)
        if llama:
            chain = Chain(rows, ids, penalty_last_n=1024, frequency=0.5, presence=0.5)
            equal["llama.cpp"], runs["llama.cpp"] = llama_case(chain, scores, expected)
        median = race(runs, rounds)
        lines.append(f"| {rows} | {vocab} | {median['hfbridge'] * 1e3:.3f} | {peer_cells(median, equal, peers)} |")
    return lines


CHAIN_CONTEXT = 256  # tokens of history; DRY looks at all of them, the penalties at the last 64
CHAIN_OPTIONS = dict(do_sample=True, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5,
                     penalty_last_n=64, dry_multiplier=0.8, dry_sequence_breakers=[], top_k=40, top_p=0.95,
                     min_p=0.05, temperature=0.8)
LLAMA_CHAIN = dict(penalty_last_n=64, repeat=1.1, frequency=0.5, presence=0.5, dry_multiplier=0.8,
                   dry_last_n=CHAIN_CONTEXT, top_k=40, top_p=0.95, min_p=0.05, temperature=0.8)


def in_llama_order() -> LogitsProcessorList:
    """hfbridge's processors for the chain's options, in llama.cpp's order (penalties, DRY, top-k, top-p,
    min-p, temperature)."""
    return LogitsProcessorList([
        PresenceFrequencyPenaltyLogitsProcessor(0.5, 0.5, 64, repetition_penalty=1.1),
        DRYLogitsProcessor(0.8, 1.75, 2, -1, sequence_breakers=[]),
        TopKLogitsWarper(40), TopPLogitsWarper(0.95), MinPLogitsWarper(0.05), TemperatureLogitsWarper(0.8)])


def chain_cases(rounds: int) -> list[str]:
    lines = ["| llama.cpp-style chain: B | V | hfbridge fast ms | llama.cpp ms | llama.cpp / hfbridge "
             "| kept sets equal | values equal | fast draws kept by HF's chain |",
             "|---:|---:|---:|---:|---:|---|---|---|"]
    for rows, vocab in [(1, 32000), (8, 50257), (32, 128256)]:
        generator = torch.Generator().manual_seed(rows)
        scores = realistic(rows, vocab, generator)
        ids = history(rows, CHAIN_CONTEXT, vocab, generator)
        reference = Chain(rows, ids, **LLAMA_CHAIN)  # without the draw: what it keeps, and the values
        done = reference.rows(scores)
        reference.apply(done)
        sets, values = agree(kept_of(in_llama_order()(ids, scores.clone())), done.kept())
        reference.free()
        sampler = Sampler(fast=True, generator=torch.Generator().manual_seed(0), **CHAIN_OPTIONS)
        kept_by_hf = Sampler(**CHAIN_OPTIONS).process(ids, scores.clone()) > float("-inf")  # [B, V], HF's order
        drawn = all(bool(kept_by_hf.gather(1, sampler(scores, ids)[:, None]).all()) for _ in range(20))
        chain = Chain(rows, ids, seed=0, **LLAMA_CHAIN)
        median = race({"hfbridge": (lambda: None, lambda _: sampler(scores, ids)),
                       "llama.cpp": llama_run(chain, scores)}, rounds)
        chain.free()
        lines.append(f"| {rows} | {vocab} | {median['hfbridge'] * 1e3:.3f} | {median['llama.cpp'] * 1e3:.3f} "
                     f"| {median['llama.cpp'] / median['hfbridge']:.2f} | {sets} | {values} | {drawn} |")
    return lines


def chain_cold_cases(rounds: int) -> list[str]:
    """The chain's step cold every time: before each timed `Sampler` call llama.cpp fills its arrays and applies
    its chain (timed: right after its own fill), which evicts hfbridge's code and data from the caches, as the
    rotation above does in half of its rounds; 40 calls a round, medians."""
    lines = ["| cold chain: B | V | calls | hfbridge fast ms, cold | llama.cpp ms, after its fill "
             "| llama.cpp / hfbridge |", "|---:|---:|---:|---:|---:|---:|"]
    for rows, vocab in [(1, 32000), (8, 50257)]:
        generator = torch.Generator().manual_seed(rows)
        scores = realistic(rows, vocab, generator)
        ids = history(rows, CHAIN_CONTEXT, vocab, generator)
        sampler = Sampler(fast=True, generator=torch.Generator().manual_seed(0), **CHAIN_OPTIONS)
        chain = Chain(rows, ids, seed=0, **LLAMA_CHAIN)
        ours, theirs = [], []
        for _ in range(40 * rounds):
            filled = chain.rows(scores)
            theirs.append(timed(lambda: chain.apply(filled)))
            ours.append(timed(lambda: sampler(scores, ids)))
        chain.free()
        mine, peer = statistics.median(ours), statistics.median(theirs)
        lines.append(f"| {rows} | {vocab} | {len(ours)} | {mine * 1e3:.3f} | {peer * 1e3:.3f} | {peer / mine:.2f} |")
    return lines


def dynatemp_cases(tgw: dict, rounds: int, llama: bool) -> list[str]:
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


def dry_path_cases(_tgw: dict | None, rounds: int, _llama: bool) -> list[str]:
    """DRY's two paths on the same CPU inputs: NumPy (what a CPU runs) and the batched, sync-free torch
    path (what an accelerator runs, forced here with `accelerator_route()`)."""
    lines = ["| DRY paths: B | V | context | NumPy ms | batched torch ms | batched / NumPy | equal |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for rows, vocab, length in [(1, 32000, 256), (1, 32000, 2048), (8, 50257, 256), (8, 50257, 2048),
                                (32, 128256, 256), (32, 128256, 2048), (128, 32000, 256), (128, 32000, 2048)]:
        generator = torch.Generator().manual_seed(rows * length)
        scores = realistic(rows, vocab, generator)
        ids = history(rows, length, vocab, generator)
        dry = DRYLogitsProcessor(0.8, 1.75, 2, -1, sequence_breakers=[[13], [198]])

        def batched(s, dry=dry, ids=ids):
            with accelerator_route():
                return dry(ids, s)
        equal = bool(torch.equal(dry(ids, scores), batched(scores)))
        median = race({"numpy": (lambda: scores.clone(), owned(lambda s, dry=dry, ids=ids: dry(ids, s))),
                       "batched": (lambda: scores.clone(), owned(batched))}, rounds)
        lines.append(f"| {rows} | {vocab} | {length} | {median['numpy'] * 1e3:.3f} | {median['batched'] * 1e3:.3f} "
                     f"| {median['batched'] / median['numpy']:.1f} | {equal} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tgw", help="text-generation-webui's modules/sampler_hijack.py (without it: no TGW columns)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["dry", "dry-paths", "penalties", "dynatemp", "chain", "chain-cold"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    rounds = 3 if args.quick else args.rounds
    tgw = load_tgw(args.tgw) if args.tgw else None
    llama = available()
    print(f"one thread, thread CPU time, median of {rounds} round-robin rounds; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, llama-cpp-python {llama or 'not installed'}, "
          f"{platform.processor() or platform.machine()}, load average {os.getloadavg()[0]:.1f}\n")
    if tgw is None:
        print("no --tgw: text-generation-webui's columns are skipped\n")
    if llama is None:
        print("llama-cpp-python is not installed: llama.cpp's columns and the chain are skipped\n")
    sections = (("dry", dry_cases, tgw or llama), ("dry-paths", dry_path_cases, True),
                ("penalties", penalty_cases, tgw or llama), ("dynatemp", dynatemp_cases, tgw),
                ("chain", lambda _tgw, n, _llama: chain_cases(n), llama),
                ("chain-cold", lambda _tgw, n, _llama: chain_cold_cases(n), llama))
    for name, section, runs in sections:
        if args.only in (None, name) and runs:
            print("\n".join(section(tgw, rounds, llama is not None)) + "\n")
        elif args.only in (None, name) and name.startswith("chain"):
            print("the llama.cpp-style chain needs llama-cpp-python\n")


if __name__ == "__main__":
    main()
