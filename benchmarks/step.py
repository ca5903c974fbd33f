"""Per-step sampling time: the hand-written HF chain vs hfbridge exact vs hfbridge `fast=True`.

    python benchmarks/step.py             # the step's speed targets (PASS/MISS), then the full table
    python benchmarks/step.py --targets   # the targets only
    python benchmarks/step.py --table     # the full table only
    python benchmarks/step.py --targets --no-compile  # without torch.compile (minutes of compiling on CPU)
    python benchmarks/step.py --quick     # targets and two sizes, fewer repeats
    python benchmarks/step.py --wall      # wall-clock time instead of this thread's CPU time
    python benchmarks/step.py --one-shot  # time sample_step(...) itself (rebuilds processors per call)
    python benchmarks/step.py --reads     # the fast step in reads of the logits at every temperature, and its parts

Method: one thread (`torch.set_num_threads(1)`), each call timed with `time.thread_time()` (CPU
time of this thread: robust on a shared machine) unless `--wall`; within one cell the
implementations run round-robin on the same logits and each number is the median of the repeats.
The floor is one read of the logits (`logits.amax(-1)`), which any sampler pays.

The HF chain is what users write today: `LogitsProcessorList` of HF's own processors, built once,
then `softmax` + `torch.multinomial` (or `argmax` for greedy); hfbridge's side is a `Sampler` built
once and called on the logits (what `generate` uses; `sample_step` is a one-shot `Sampler`).
Logits are either flat (standard normal) or realistic: log-probability proportional to
-1.1 * log(rank), randomly permuted per row, plus N(0, 0.1) noise.
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from hfbridge import Sampler, accelerator_route, sample_step
from hfbridge._step.fast.fast_path import fast_sample
from hfbridge._step.fast.top_p.compiled import _radix
from hfbridge._step.fast.weighted_draw import draw_checked

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

CLOCK = time.thread_time


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


def floor(logits, input_ids):
    """One read of the logits: the least any sampler pays."""
    return logits.amax(dim=-1)


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
            start = CLOCK()
            step(logits, input_ids)
            sync()
            times[name].append(CLOCK() - start)
    return {name: statistics.median(t) for name, t in times.items()}


class _MallInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ["arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost"]]


def _heap_in_use() -> int | None:
    """Bytes the C heap has handed out (glibc's `mallinfo2`: heap chunks plus mmapped blocks)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return None
    return info.uordblks + info.hblkhd


class _PeakMemory(TorchDispatchMode):
    """The most C-heap memory in use after any op, above what was in use before the first op."""

    def __init__(self) -> None:
        super().__init__()
        self.base: int | None = None
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.base is None:
            self.base = self.peak = _heap_in_use() or 0
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, _heap_in_use() or 0)
        return out


def peak_extra_memory(make_step, logits, input_ids) -> float | None:
    """Peak memory a step allocates on CPU (tensors alive at once), in units of the logits' bytes: a second step
    of a new `make_step()`, over what was in use before its first, so that the buffers a `Sampler` keeps from
    one step to the next (`hfbridge/_step/fast/workspace.py`) are counted."""
    base = _heap_in_use()
    if logits.device.type != "cpu" or base is None:
        return None
    step = make_step()
    step(logits, input_ids)  # warm-up: what it keeps for the next step is counted from `base`
    with _PeakMemory() as meter:
        step(logits, input_ids)
    return (meter.peak - base) / (logits.numel() * logits.element_size())


def targets(repeats: int, one_shot: bool, compiled: bool = True) -> None:
    """The step's speed targets, each with its ratio and PASS/MISS."""
    generator = torch.Generator().manual_seed(0)
    print(f"\n### targets (CPU: {describe('cpu')}; torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{'wall' if CLOCK is time.perf_counter else 'thread CPU'} time, "
          f"median of {repeats}; B=1: {5 * repeats})\n")
    print("| target | HF chain ms | fast ms | floor (amax) ms | measured | PASS/MISS |")
    print("|---|---:|---:|---:|---|---|")

    def top_p_cell(kind, batch, vocab, temperature, rounds=repeats):
        logits = make_logits(kind, batch, vocab, generator)
        input_ids = torch.randint(0, vocab, (batch, PROMPT), generator=generator)
        draw = torch.Generator().manual_seed(1)
        options = dict(do_sample=True, temperature=temperature, top_p=0.9, top_k=0)
        hf = hf_chain(LogitsProcessorList([TemperatureLogitsWarper(temperature), TopPLogitsWarper(0.9)]), True, draw)
        fast = bridge(options, draw, fast=True, one_shot=one_shot)
        t = measure({"hf": hf, "fast": fast, "floor": floor}, logits, input_ids, rounds, lambda: None)
        return t, fast, logits, input_ids

    def row(name, t, measured, ok):
        print(f"| {name} | {t['hf'] * 1e3:.2f} | {t['fast'] * 1e3:.2f} | {t['floor'] * 1e3:.3f} | {measured} | "
              f"{'PASS' if ok else 'MISS'} |", flush=True)

    for temperature in (0.7, 0.8, 1.0):
        t, *_ = top_p_cell("realistic", 32, 128256, temperature)
        speedup = t["hf"] / t["fast"]
        row(f"realistic top-p 0.9, T={temperature}, B=32, V=128256: HF / fast >= 20", t,
            f"{speedup:.1f}x", speedup >= 20)
        if temperature == 0.8:
            over = t["fast"] / t["floor"]
            row("realistic top-p 0.9, T=0.8, B=32, V=128256: fast / amax <= 30", t, f"{over:.1f}x", over <= 30)
    # A B=1 round takes ~5 ms: 5x the rounds, so that its median holds from run to run (7 varied by ~10%)
    t, *_ = top_p_cell("realistic", 1, 32000, 0.8, rounds=5 * repeats)
    row("realistic top-p 0.9, T=0.8, B=1, V=32000: HF / fast >= 6", t, f"{t['hf'] / t['fast']:.1f}x",
        t["hf"] / t["fast"] >= 6)
    t, _, logits, input_ids = top_p_cell("flat", 32, 128256, 0.8)
    row("flat top-p 0.9, T=0.8, B=32, V=128256: HF / fast >= 8", t, f"{t['hf'] / t['fast']:.1f}x",
        t["hf"] / t["fast"] >= 8)
    options = dict(do_sample=True, temperature=0.8, top_p=0.9, top_k=0)
    memory = peak_extra_memory(lambda: bridge(options, torch.Generator().manual_seed(1), fast=True,
                                              one_shot=one_shot), logits, input_ids)
    if memory is not None:
        print(f"| flat top-p 0.9, T=0.8, B=32, V=128256: peak extra memory <= 3x the logits | - | - | - | "
              f"{memory:.2f}x | {'PASS' if memory <= 3 else 'MISS'} |", flush=True)
    if compiled:
        compiled_vs_eager(repeats)


def reads(repeats: int) -> None:
    """The fast step (temperature + top-p 0.9) at B=32, V=128256 in reads of the logits (`amax`), at every
    temperature on flat and realistic rows, beside what any route that needs the probabilities' total pays:
    the division by the temperature and the softmax (whose `exp` is the cost), and the pages the step faults in."""
    import resource

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    print(f"\n### the fast step in reads of the logits (CPU: {describe('cpu')}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s), thread CPU time, median of {repeats}, round-robin)\n")
    print("| logits | T | fast ms | amax ms | fast / amax | division / amax | softmax / amax | exp / amax | "
          "pages faulted per step |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    generator = torch.Generator().manual_seed(0)
    for kind in ("realistic", "flat"):
        logits = make_logits(kind, 32, 128256, generator)  # [B, V]
        input_ids = torch.randint(0, 128256, (32, PROMPT), generator=generator)
        for temperature in (0.7, 0.8, 1.0):
            fast = Sampler(generator=torch.Generator().manual_seed(1), fast=True, do_sample=True,
                           temperature=temperature, top_p=0.9, top_k=0)
            parts = {"fast": fast, "floor": floor,
                     "division": lambda x, _, t=temperature: x / t,
                     "softmax": lambda x, _: torch.softmax(x, dim=-1),
                     "exp": lambda x, _: torch.exp(x)}
            for _ in range(3):  # the sampler learns where its cuts lie, as in a generation
                fast(logits, input_ids)
            before = faults()
            for _ in range(repeats):
                fast(logits, input_ids)
            faulted = (faults() - before) / repeats
            t = measure(parts, logits, input_ids, repeats, lambda: None)
            base = t["floor"]
            print(f"| {kind} | {temperature} | {t['fast'] * 1e3:.2f} | {base * 1e3:.3f} | {t['fast'] / base:.1f} | "
                  f"{t['division'] / base:.1f} | {t['softmax'] / base:.1f} | {t['exp'] / base:.1f} | {faulted:.0f} |",
                  flush=True)


def compiled_vs_eager(repeats: int) -> None:
    """`torch.compile` (inductor, `fullgraph=True`) of the fixed-shape path against the eager fast path.

    "compiled": `fast_sample(..., candidates=False)` compiled: 512 candidates, `torch.cond` on the
    device flag, the draw over the candidates (the radix select and a draw over the rows only when a
    row's cut is not among them, `_fixed_shape.py`). "compiled, C++ wrapper": the same graph with
    inductor's `cpp_wrapper=True`, which calls the kernels from C++ instead of a generated Python
    function (the same tokens). "radix": the route before, the radix select over every row,
    compiled the same way. "eager": the default eager CPU path (candidates, one flag read per try,
    NumPy views at batch 1). "accelerator eager": eager under `accelerator_route()`, what eager runs
    on an accelerator (no CPU-only shortcut: the radix select). The targets are against "eager";
    the ratio to "accelerator eager" is printed too. Compile times are wall time.
    """
    import torch._inductor.config as inductor_config

    processors = LogitsProcessorList([TemperatureLogitsWarper(0.8), TopPLogitsWarper(0.9)])
    for kind, batch, vocab in (("realistic", 32, 128256), ("realistic", 1, 32000)):
        logits = make_logits(kind, batch, vocab, torch.Generator().manual_seed(2))

        # Three functions, not one: dynamo keeps one compiled entry per function's code.
        def fixed_shape(x):
            return fast_sample(None, x.clone(), processors, candidates=False)

        def fixed_shape_cpp(x):
            return fast_sample(None, x.clone(), processors, candidates=False)

        def radix(x, temperature=0.8, top_p=0.9):
            scores = x.clone().div_(temperature)
            probs = torch.softmax(scores, dim=-1)
            return draw_checked(probs.masked_fill_(~_radix(probs, scores, top_p, 1), 0.0))[0]

        compiled, seconds = {}, {}
        for name, fn, options in (("compiled", fixed_shape, {}), ("cpp", fixed_shape_cpp, {"cpp_wrapper": True}),
                                  ("radix", radix, {})):
            start = time.perf_counter()
            try:
                compiled[name] = torch.compile(fn, dynamic=False, fullgraph=True)
                with inductor_config.patch(options):
                    compiled[name](logits)  # the first call compiles
            except Exception as error:  # no compiler toolchain here, or an inductor bug
                print(f"| torch.compile ({name}): failed ({type(error).__name__}: "
                      f"{str(error).splitlines()[0][:120]}) | - | - | - | - | - |", flush=True)
                return
            seconds[name] = time.perf_counter() - start

        def accelerator_eager(x, _ids):
            with accelerator_route():
                return fast_sample(None, x.clone(), processors)

        steps = {"eager": lambda x, _ids: fast_sample(None, x.clone(), processors),
                 "accelerator": accelerator_eager,
                 "compiled": lambda x, _ids: compiled["compiled"](x),
                 "cpp": lambda x, _ids: compiled["cpp"](x),
                 "radix": lambda x, _ids: compiled["radix"](x), "floor": floor}
        t = measure(steps, logits, None, repeats, lambda: None)
        cell = f"realistic top-p 0.9, T=0.8, B={batch}, V={vocab}"
        for name, label in (("compiled", "compiled fixed-shape path"),
                            ("cpp", "compiled fixed-shape path, inductor's C++ wrapper")):
            ratio = t[name] / t["eager"]
            print(f"| {label}, {cell}: compiled / eager <= 1 | - | {t[name] * 1e3:.2f} (eager {t['eager'] * 1e3:.2f}; "
                  f"accelerator eager {t['accelerator'] * 1e3:.2f}, compiled / it {t[name] / t['accelerator']:.2f}x; "
                  f"compile {seconds[name]:.0f} s) | {t['floor'] * 1e3:.3f} | {ratio:.2f}x | "
                  f"{'PASS' if ratio <= 1 else 'MISS'} |", flush=True)
        print(f"| (the route before: the radix select over every row, compiled), {cell} | - | {t['radix'] * 1e3:.2f} "
              f"({t['radix'] / t['eager']:.2f}x eager; compile {seconds['radix']:.0f} s) | {t['floor'] * 1e3:.3f} "
              "| - | - |", flush=True)


def table(device: str, sizes, repeats: int, configs, one_shot: bool) -> None:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(0)
    what = "sample_step (one-shot)" if one_shot else "a Sampler built once"
    print(f"\n### {device}: {describe(device)}; torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{'wall' if CLOCK is time.perf_counter else 'thread CPU'} time, median of {repeats}; "
          f"exact/fast = {what}\n")
    print("| B | V | logits | config | HF chain ms | exact ms | fast ms | exact / HF | HF / fast | fast / amax |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|")
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
                    "floor": floor,
                }
                if options["do_sample"]:
                    steps["fast"] = bridge(options, draw, fast=True, one_shot=one_shot)
                t = measure(steps, logits, input_ids, repeats, sync)
                fast = f"{t['fast'] * 1e3:.2f}" if "fast" in t else "-"
                speedup = f"{t['hf'] / t['fast']:.1f}x" if "fast" in t else "-"
                over = f"{t['fast'] / t['floor']:.0f}x" if "fast" in t else "-"
                print(f"| {batch} | {vocab} | {kind} | {name} | {t['hf'] * 1e3:.2f} | {t['exact'] * 1e3:.2f} | "
                      f"{fast} | {t['exact'] / t['hf']:.2f} | {speedup} | {over} |", flush=True)


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
    global CLOCK
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two sizes, 3 repeats")
    parser.add_argument("--targets", action="store_true", help="only the step's speed targets")
    parser.add_argument("--table", action="store_true", help="only the full table (no targets)")
    parser.add_argument("--reads", action="store_true",
                        help="only the fast step in reads of the logits at every temperature, and its parts")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the torch.compile comparison (its first compile takes minutes on CPU)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per cell (default 7, quick 3)")
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--config", action="append", choices=list(CONFIGS), help="only these configs")
    parser.add_argument("--wall", action="store_true", help="wall-clock time (default: this thread's CPU time)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--one-shot", action="store_true",
                        help="time sample_step(...) itself, which rebuilds its processors on every call "
                             "(default: a Sampler built once, as the HF chain's processors are)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    if args.wall:
        CLOCK = time.perf_counter
    repeats = args.repeats or (3 if args.quick else 7)
    if args.reads:
        reads(repeats)
        return
    if not args.table:
        targets(repeats, args.one_shot, compiled=not args.no_compile)
    if args.targets:
        return
    sizes = QUICK_SIZES if args.quick else SIZES
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    for device in devices:
        if device == "cuda" and not torch.cuda.is_available():
            print("\nNo CUDA device here: no CUDA table.")
            continue
        table(device, sizes, repeats, args.config or list(CONFIGS), args.one_shot)


if __name__ == "__main__":
    main()
