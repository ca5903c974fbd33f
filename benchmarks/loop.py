"""The generation loop: hfbridge.generate against a bare hand loop and HF's `model.generate`.

    python benchmarks/loop.py            # every table, 7 repeats
    python benchmarks/loop.py --quick    # 3 repeats, shorter runs
    python benchmarks/loop.py --wall     # wall-clock time instead of this thread's CPU time

One thread (`torch.set_num_threads(1)`), this thread's CPU time by default (a busy machine slows
it much less than wall time), the variants of each cell run round-robin, medians. Tables:

1. Loop overhead, greedy, B=1: a cheap model (one row lookup, V=32000) run by a bare hand loop
   (`model(ids)`, `argmax`, `cat`) and by `generate` (CPU route, and the accelerator route with
   torch's argmax); the slope between two lengths, paired per round, gives the µs per step
   `generate` adds, free of its per-call setup. Target: <= 15 µs per step.
2. Tokens/s on a tiny random `LlamaForCausalLM` with its KV cache: `model.generate` against
   `hfbridge.generate(ReturnsCache(...))`, both calling the model as HF's `generate` does
   (last-position logits, no all-ones mask). Target (greedy, B=1): hfbridge >= HF.
3. Exact mode against the hand-written HF chain (`LogitsProcessorList` built once, `softmax` +
   `torch.multinomial` or `argmax`), B=1, V=32000, one call per step on the same logits.
   Target: exact <= 1.05x the HF chain.
4. Host reads of device values per decode step (each a host-device sync on an accelerator),
   counted with a `TorchDispatchMode` on CPU (tests/_host_reads.py). Target: <= 1 in greedy and
   fast sampling, on the route an accelerator runs (the fast path's fixed-shape kernels, forced on
   CPU with `accelerator_route()`; on CPU eager its candidate checks read CPU flags, no sync).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "tests"))
from _host_reads import HostReads  # noqa: E402

from hfbridge import ReturnsCache, Sampler, accelerator_route, generate  # noqa: E402

MODES = {
    "greedy": dict(do_sample=False),
    "sampling": dict(do_sample=True, temperature=0.7, top_k=50, top_p=0.9),
    "sampling (top_k=0)": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0),
}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def timed(clock: Callable[[], float], runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each run, round-robin after one warm-up each."""
    for run in runs.values():
        run()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = clock()
            run()
            seconds[name].append(clock() - start)
    return {name: statistics.median(s) for name, s in seconds.items()}


# ---- 1. per-step overhead over a bare hand loop ----

def cheap_model(vocab: int) -> Callable[[torch.Tensor], torch.Tensor]:
    table = torch.randn(64, vocab, generator=torch.Generator().manual_seed(0))

    def model(ids):  # [B, T] -> [B, 1, V]: one row per sequence, looked up from the last token
        return table[ids[:, -1:] % 64]
    return model


def bare_loop(model, ids: torch.Tensor, new: int) -> torch.Tensor:
    for _ in range(new):
        logits = model(ids)
        token = logits[:, -1].argmax(dim=-1)
        ids = torch.cat([ids, token[:, None]], dim=-1)
    return ids


def rounds(clock, runs: dict[str, Callable[[], object]], repeats: int) -> list[dict[str, float]]:
    """Seconds of each run in each round; the order rotates from round to round (one warm-up each)."""
    for run in runs.values():
        run()
    names = list(runs)
    out = []
    for index in range(repeats):
        order = names[index % len(names):] + names[: index % len(names)]
        seconds = {}
        for name in order:
            start = clock()
            runs[name]()
            seconds[name] = clock() - start
        out.append(seconds)
    return out


def overhead(clock, repeats: int, quick: bool) -> float:
    """µs per step that `generate` adds to a bare loop, from paired slopes: within each round, the
    extra steps' time (long - short run) of each variant, then the median over rounds of each
    variant and of the per-round differences (a round's runs share the machine's load)."""
    model = cheap_model(32000)
    prompt = torch.tensor([[1, 2, 3, 4]])
    short, long = (16, 80) if quick else (32, 160)
    steps = long - short

    def accelerator_generate(new):
        with accelerator_route():
            return generate(model, prompt, max_new_tokens=new)
    variants = {
        "bare": lambda new: bare_loop(model, prompt, new),
        "generate": lambda new: generate(model, prompt, max_new_tokens=new),
        "generate (accelerator route)": accelerator_generate,
    }
    runs = {f"{name} {new}": (lambda run=run, new=new: run(new))
            for name, run in variants.items() for new in (short, long)}
    measured = rounds(clock, runs, 3 * repeats)
    for run in variants.values():
        assert torch.equal(bare_loop(model, prompt, short), run(short))

    def slope(seconds, name):
        return (seconds[f"{name} {long}"] - seconds[f"{name} {short}"]) / steps
    per_step = {name: statistics.median(slope(r, name) for r in measured) for name in variants}
    extra = {name: statistics.median(slope(r, name) - slope(r, "bare") for r in measured) for name in variants}
    setup = statistics.median(r[f"generate {short}"] - r[f"bare {short}"]
                              - short * (slope(r, "generate") - slope(r, "bare")) for r in measured)
    print("### 1. Loop overhead: greedy, B=1, a one-row-lookup model (V=32000)\n")
    print(f"Slopes between {short} and {long} new tokens, paired per round ({len(measured)} rounds, rotating order), "
          "medians. The bare loop is `model(ids)`, `logits[:, -1].argmax(-1)`, `torch.cat`. On CPU `generate`'s "
          "argmax is numpy's (`_step/run/cpu_shortcuts.py`); the accelerator route runs torch's, as the bare loop: "
          "its difference "
          "is the loop's own overhead.\n")
    print("| loop | µs/step | - bare loop µs/step (paired) | target <= 15 |")
    print("|---|---:|---:|---|")
    for name in variants:
        cells = "-" if name == "bare" else f"{extra[name] * 1e6:.0f}"
        ok = "" if name == "bare" else verdict(extra[name] * 1e6 <= 15)
        print(f"| {name} | {per_step[name] * 1e6:.0f} | {cells} | {ok} |")
    print(f"\n`generate`'s setup per call: {setup * 1e3:.2f} ms\n", flush=True)
    return max(extra["generate"], extra["generate (accelerator route)"]) * 1e6


# ---- 2. tokens/s against model.generate on a tiny Llama ----

def tiny_llama(vocab: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # random weights: never stop early, count every token
    model.generation_config.pad_token_id = 0
    return model


def cached(model: LlamaForCausalLM) -> ReturnsCache:
    # What HF's generate does inside for the same call: no mask for padding-free prompts (5.x drops an
    # all-ones mask) and logits for the last position only (`logits_to_keep`, 4.46: `num_logits_to_keep`).
    keep = "logits_to_keep" if "logits_to_keep" in inspect.signature(model.forward).parameters else "num_logits_to_keep"

    def step(input_ids, cache):
        out = model(input_ids=input_ids, past_key_values=cache, use_cache=True, **{keep: 1})
        return out.logits, out.past_key_values
    return ReturnsCache(step)


def tokens_per_second(clock, repeats: int, new: int, vocab: int, batches: tuple[int, ...]) -> float:
    model = tiny_llama(vocab)
    adapter = cached(model)
    print(f"### 2. Tokens/s: tiny LlamaForCausalLM (2 layers, hidden 64, vocab {vocab}), prompt 16, "
          f"{new} new tokens, KV cache on both sides\n")
    print("| B | mode | model.generate tok/s | hfbridge.generate tok/s | fast=True tok/s | hfbridge / HF | fast / HF |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    greedy_b1 = float("nan")
    for batch in batches:
        prompt = torch.randint(3, vocab, (batch, 16), generator=torch.Generator().manual_seed(0))
        for mode, options in MODES.items():
            if batch == 1 and mode != "greedy":
                continue
            runs = {
                "hf": lambda o=options: model.generate(prompt, max_new_tokens=new, min_new_tokens=new, **o),
                "ours": lambda o=options: generate(adapter, prompt, max_new_tokens=new, min_new_tokens=new, **o),
            }
            if options["do_sample"]:
                runs["fast"] = lambda o=options: generate(adapter, prompt, max_new_tokens=new, min_new_tokens=new,
                                                          fast=True, **o)
            with torch.inference_mode():
                t = timed(clock, runs, repeats)
            rate = {name: batch * new / seconds for name, seconds in t.items()}
            fast = rate.get("fast")
            ratio = rate["ours"] / rate["hf"]
            if batch == 1 and mode == "greedy":
                greedy_b1 = ratio
            fast_rate = f"{fast:.0f}" if fast else "-"
            fast_ratio = f"{fast / rate['hf']:.2f}" if fast else "-"
            print(f"| {batch} | {mode} | {rate['hf']:.0f} | {rate['ours']:.0f} | {fast_rate} | {ratio:.2f} | "
                  f"{fast_ratio} |", flush=True)
    print(f"\nTarget, greedy B=1: hfbridge / HF >= 1.00: {verdict(greedy_b1 >= 1.0)} ({greedy_b1:.2f})\n")
    return greedy_b1


# ---- 3. exact mode against the HF chain ----

CHAINS = {
    "greedy": (list, dict(do_sample=False)),
    "temp+top-k": (lambda: [TemperatureLogitsWarper(0.7), TopKLogitsWarper(50)],
                   dict(do_sample=True, temperature=0.7, top_k=50)),
    "temp+top-p": (lambda: [TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)],
                   dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0)),
}


def realistic_logits(batch: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Zipf-like logits: log-probability -1.1 * log(rank), ranks permuted per row, plus a little noise."""
    log_rank = torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
    rows = [-1.1 * log_rank[torch.randperm(vocab, generator=generator)] for _ in range(batch)]
    return torch.stack(rows) + 0.1 * torch.randn(batch, vocab, generator=generator)


def exact_vs_chain(clock, repeats: int) -> float:
    generator = torch.Generator().manual_seed(0)
    logits = realistic_logits(1, 32000, generator)[:, None, :]  # [B=1, T=1, V]: a model's output
    input_ids = torch.randint(0, 32000, (1, 64), generator=generator)
    print("### 3. Exact mode vs the hand-written HF chain, B=1, V=32000, realistic logits "
          "(µs per call; the chain copies to float32 as HF's loop does; accelerator route: no CPU shortcut, "
          "torch's argmax)\n")
    print("| config | HF chain µs | exact µs | exact / HF | exact, accelerator route µs | its / HF | target <= 1.05 |")
    print("|---|---:|---:|---:|---:|---:|---|")
    worst = 0.0
    for name, (make, options) in CHAINS.items():
        processors = LogitsProcessorList(make())
        draw = torch.Generator().manual_seed(1)

        def chain(processors=processors, do_sample=options["do_sample"], draw=draw):
            scores = processors(input_ids, logits[:, -1].to(dtype=torch.float32, copy=True))
            if not do_sample:
                return scores.argmax(dim=-1)
            return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1, generator=draw).squeeze(1)
        sampler = Sampler(generator=draw, **options)

        def accelerator(sampler=sampler):
            with accelerator_route():
                return sampler(logits, input_ids)
        t = timed(clock, {"hf": chain, "exact": lambda sampler=sampler: sampler(logits, input_ids),
                          "accelerator": accelerator}, repeats * 30)
        ratio, route = t["exact"] / t["hf"], t["accelerator"] / t["hf"]
        worst = max(worst, ratio)
        print(f"| {name} | {t['hf'] * 1e6:.0f} | {t['exact'] * 1e6:.0f} | {ratio:.2f} | {t['accelerator'] * 1e6:.0f} | "
              f"{route:.2f} | {verdict(ratio <= 1.05)} |", flush=True)
    print()
    return worst


# ---- 4. host reads per decode step ----

def host_reads(vocab: int) -> float:
    model = tiny_llama(vocab)
    adapter = cached(model)
    prompt = torch.randint(3, vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    cases = {
        "greedy": dict(do_sample=False),
        "exact sampling (temperature + top-p)": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0),
        "fast sampling (temperature + top-p)": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0, fast=True),
        "fast sampling (temperature + HF's default top-k 50)": dict(do_sample=True, temperature=0.7, fast=True),
    }

    def per_step(run) -> tuple[float, float]:
        """Reads per decode step in all, and those inside the sampling step (`Sampler.next_tokens`)."""
        totals, inside = [], []
        original = Sampler.next_tokens
        for new in (8, 24):
            with HostReads() as reads, torch.inference_mode():
                within = [0]

                def counted(self, *args, _reads=reads, _within=within, **kwargs):
                    before = _reads.count
                    try:
                        return original(self, *args, **kwargs)
                    finally:
                        _within[0] += _reads.count - before
                Sampler.next_tokens = counted
                try:
                    run(new)
                finally:
                    Sampler.next_tokens = original
            totals.append(reads.count)
            inside.append(within[0])
        return (totals[1] - totals[0]) / 16, (inside[1] - inside[0]) / 16

    print("### 4. Host reads of device values per decode step (B=2, eos set; in brackets: of them inside the "
          "fast sampling step)\n")
    print("On CPU eager greedy's argmax reads the logits through numpy and the fast step's candidate route reads a "
          "few flags (CPU memory, no sync); an accelerator runs neither: the accelerator route, forced here on CPU "
          "with `hfbridge.accelerator_route()`, is what the target counts.\n")
    print("| mode | model.generate | hfbridge.generate, CPU eager | hfbridge.generate, accelerator route | "
          "target <= 1 (greedy, fast) |")
    print("|---|---:|---:|---:|---|")
    worst = 0.0
    for name, options in cases.items():
        common = dict(min_new_tokens=0, eos_token_id=1, pad_token_id=0)
        hf_options = {key: value for key, value in options.items() if key != "fast"}
        hf, _ = per_step(lambda new, o=hf_options: model.generate(prompt, max_new_tokens=new, **common, **o))

        def ours(new, o=options):
            return generate(adapter, prompt, max_new_tokens=new, **common, **o)
        cpu, cpu_inside = per_step(ours)
        with accelerator_route():
            route, route_inside = per_step(ours)
        fast = options.get("fast", False)
        inside = (f" ({cpu_inside:.2f})", f" ({route_inside:.2f})") if fast else ("", "")
        counted = fast or not options["do_sample"]  # exact sampling keeps torch.multinomial's own read, as HF
        if counted:
            worst = max(worst, route)
        ok = verdict(route <= 1) if counted else "- (multinomial's own check)"
        print(f"| {name} | {hf:.2f} | {cpu:.2f}{inside[0]} | {route:.2f}{inside[1]} | {ok} |", flush=True)
    print()
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats, shorter runs")
    parser.add_argument("--wall", action="store_true", help="wall-clock time instead of this thread's CPU time")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--only", choices=["1", "2", "3", "4"], action="append", help="run only these tables")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    clock = time.perf_counter if args.wall else time.thread_time
    repeats = 3 if args.quick else 7
    new = 32 if args.quick else 64
    only = set(args.only or "1234")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, "
          f"{'wall' if args.wall else 'thread CPU'} time, median of {repeats}, round-robin; no GPU timings here "
          "(CPU only)\n")
    results = {}
    if "1" in only:
        results["1"] = overhead(clock, repeats, args.quick)
    if "2" in only:
        results["2"] = tokens_per_second(clock, repeats, new, args.vocab, (1, 4))
    if "3" in only:
        results["3"] = exact_vs_chain(clock, repeats)
    if "4" in only:
        results["4"] = host_reads(args.vocab)
    print("### Targets\n")
    lines = {
        "1": lambda v: f"generate - bare loop, greedy B=1: {v:.0f} µs/step (<= 15): {verdict(v <= 15)}",
        "2": lambda v: f"tokens/s vs model.generate, greedy B=1: {v:.2f}x (>= 1.00): {verdict(v >= 1)}",
        "3": lambda v: f"exact vs HF chain, worst config: {v:.2f}x (<= 1.05): {verdict(v <= 1.05)}",
        "4": lambda v: f"host reads per step, greedy and fast sampling (accelerator route): {v:.2f} (<= 1): "
                       f"{verdict(v <= 1)}",
    }
    for key, value in results.items():
        print("- " + lines[key](value))


if __name__ == "__main__":
    main()
