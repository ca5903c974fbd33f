"""hfbridge's vLLM processor: its per-step cost at 32 concurrent requests with mixed options.

    python benchmarks/vllm.py                  # both parts (needs vLLM: docs/vllm.md)
    python benchmarks/vllm.py --part processor # the processors alone, V=32000, no engine
    python benchmarks/vllm.py --part engine    # three engines on a tiny Llama, V=32000
    python benchmarks/vllm.py --part sampling  # hfbridge's chain against vLLM's own sampling, in one engine run
    python benchmarks/vllm.py --part chain     # the sampling part's option sets, the processor alone (CPU time)

Three ways to serve the same 32 requests (8 each of four option sets: HF's repetition penalty;
no-repeat-3-gram + DRY; temperature + top-k + top-p; repetition penalty + top-n-sigma + min-p):

- `hfbridge`: `HFBridgeLogitsProcessor`, one `Sampler.process` call per option set and step;
- `adapter`: vLLM's `AdapterLogitsProcessor` running the same processors (`hfbridge.build_processors`:
  HF's classes and hfbridge's samplers) row by row, the request's history made a tensor each step,
  which is what its per-request callables lead to;
- `none`: vLLM without custom processors (the requests without options): the floor.

`processor` part: `update_state` + `apply` on `(32, 32000)` float32 logits, histories of 200-260
prompt tokens growing by one each step; each step timed with `time.thread_time()` (one thread),
the implementations round-robin on the same logits, medians of 40 steps after 5 of warm-up.
`engine` part: `LLM.generate` of the 32 requests, 64 tokens each (eos ignored), on a tiny random
Llama with a 32000-token vocabulary; wall time per generated step (the batch moves in lock step),
median of 5 runs per engine, the three engines up at once and their runs alternating.
`sampling` part: two engines up at once (vLLM without custom processors; vLLM with
`HFBridgeLogitsProcessor`), the same tiny Llama, prompts of exactly 256 or 2,048 tokens, 1, 8 or 32
requests. Per configuration, the engine step is `(T(65 tokens) - T(1 token)) / 64` (wall time of
`LLM.generate`, prefix caching on, so the prompts' prefill is out of it), medians of the round-robin
repeats. Configurations: `plain` (vLLM sampling at temperature 1, nothing else: the floor), `vllm`
(vLLM's own repetition / presence / frequency penalties, top-k, top-p, min-p), `hfbridge` (the same
options through hfbridge), and at 32 requests hfbridge's DRY, XTC, top-nσ and mirostat 2 (their
share of the engine step over `plain`). `chain` part: the same option sets through
`HFBridgeLogitsProcessor` alone (`update_state` + `apply`, thread CPU time, medians of 30 steps after 5).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# this file is named like the vllm package: take its folder off the path before importing vllm
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "tests" / "vllm"))

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor, BatchUpdate  # noqa: E402

from hfbridge import build_processors  # noqa: E402
from hfbridge.vllm import HFBridgeLogitsProcessor  # noqa: E402

B, V, NEW = 32, 32000, 64
OPTION_SETS = [
    ({"repetition_penalty": 1.3}, 0.0),
    ({"no_repeat_ngram_size": 3, "dry_multiplier": 0.8, "dry_sequence_breakers": [[3]]}, 0.0),
    ({"temperature": 0.8, "top_k": 40, "top_p": 0.9}, 1.0),
    ({"repetition_penalty": 1.2, "top_n_sigma": 1.5, "min_p": 0.05}, 1.0),
]


def requests(count: int = B, vocab: int = V, *, with_options: bool = True) -> list[SamplingParams]:
    params = []
    for i in range(count):
        options, temperature = OPTION_SETS[i % len(OPTION_SETS)]
        params.append(SamplingParams(temperature=temperature, max_tokens=NEW, ignore_eos=True,
                                     detokenize=False, extra_args={"hfbridge": options} if with_options else None))
    return params


class HFPerRow(AdapterLogitsProcessor):
    """The same processors through vLLM's per-request adapter: one list per request, called row by row."""

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        options = (params.extra_args or {}).get("hfbridge")
        if not options:
            return None
        processors = None

        def apply(prompt_ids, output_ids, logits):  # [V] one row
            nonlocal processors
            if processors is None:  # presence/frequency counting aside, no option here needs the prompt length
                processors = build_processors(do_sample=params.temperature >= 1e-5, **options)
            ids = torch.tensor([list(prompt_ids) + list(output_ids)])
            return processors(ids, logits[None].float())[0].to(logits.dtype)

        return apply


def config(vocab: int) -> SimpleNamespace:
    """The parts of a VllmConfig the processors read."""
    model = SimpleNamespace(get_vocab_size=lambda: vocab, seed=0, hf_config=SimpleNamespace(eos_token_id=2),
                            tokenizer=None, tokenizer_revision=None, trust_remote_code=False)
    return SimpleNamespace(model_config=model)


def processor_part(steps: int = 40, warmup: int = 5) -> None:
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    params = requests()
    prompts = [torch.randint(3, V, (int(n),), generator=generator).tolist()
               for n in torch.randint(200, 260, (B,), generator=generator)]
    implementations = {"hfbridge": HFBridgeLogitsProcessor, "adapter": HFPerRow}
    processors, outputs = {}, {}
    for name, cls in implementations.items():
        processor = cls(config(V), torch.device("cpu"), False)
        outputs[name] = [[] for _ in range(B)]
        processor.update_state(BatchUpdate(batch_size=B, removed=[], moved=[],
                                           added=[(i, params[i], prompts[i], outputs[name][i]) for i in range(B)]))
        processors[name] = processor
    times: dict[str, list[float]] = {name: [] for name in implementations}
    for step in range(warmup + steps):
        logits = torch.randn(B, V, generator=generator) * 4  # [B, V]
        token = torch.randint(3, V, (B,), generator=generator).tolist()
        for name, processor in processors.items():
            work = logits.clone()
            start = time.thread_time()
            processor.update_state(None)
            processor.apply(work)
            elapsed = time.thread_time() - start
            if step >= warmup:
                times[name].append(elapsed)
            for i in range(B):
                outputs[name][i].append(token[i])
    hf_ms = statistics.median(times["adapter"]) * 1e3
    ours_ms = statistics.median(times["hfbridge"]) * 1e3
    print(f"\nprocessor part: B={B}, V={V}, 4 option sets x 8 requests, medians of {steps} steps (thread CPU time)\n")
    print("| processor | ms / step | vs adapter |\n|---|---:|---:|")
    print(f"| hfbridge (one call per option set) | {ours_ms:.2f} | {hf_ms / ours_ms:.1f}x faster |")
    print(f"| AdapterLogitsProcessor, HF's processors per row | {hf_ms:.2f} | 1.0x |")


def engine_part(repeats: int = 5) -> None:
    from vllm import LLM

    import _tiny_llama

    folder = _tiny_llama.save(tempfile.mkdtemp(prefix="hfbridge-bench-"), vocab_size=V)
    prompts = [{"prompt_token_ids": p} for p in _tiny_llama.prompts(B, seed=0, low=200, high=260, vocab_size=V)]
    runs = {"none": (None, False), "hfbridge": ([HFBridgeLogitsProcessor], True), "adapter": ([HFPerRow], True)}
    engines = {}
    try:
        for name, (processors, _) in runs.items():  # all three up at once, so that the runs can alternate
            # all prompts prefilled in one step: vLLM 0.32's CPU runner fails on a chunked prefill of a seeded request
            engines[name] = LLM(model=str(folder), dtype="float32", max_model_len=512, max_num_seqs=B,
                                enforce_eager=True, seed=0, max_num_batched_tokens=B * 512,
                                logits_processors=processors)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for repeat in range(repeats + 1):  # round-robin: a busy machine slows all three alike; the first is warm-up
            for name, llm in engines.items():
                params = requests(with_options=runs[name][1])
                start = time.perf_counter()
                outputs = llm.generate(prompts, params, use_tqdm=False)
                if repeat:
                    times[name].append((time.perf_counter() - start) / NEW)
                assert all(len(out.outputs[0].token_ids) == NEW for out in outputs)
    finally:
        for llm in engines.values():
            _tiny_llama.shutdown(llm)
        engines.clear()
        gc.collect()
    per_step = {name: statistics.median(values) for name, values in times.items()}
    floor = per_step["none"]
    print(f"\nengine part: B={B}, V={V}, {NEW} tokens per request, tiny Llama (2 layers, width 64), "
          f"medians of {repeats} round-robin runs (wall time)\n")
    print("| engine | ms / step | vs none | processor's own ms / step |\n|---|---:|---:|---:|")
    for name, label in (("none", "vLLM, no custom processor"), ("hfbridge", "HFBridgeLogitsProcessor"),
                        ("adapter", "AdapterLogitsProcessor, HF's per row")):
        ms = per_step[name] * 1e3
        print(f"| {label} | {ms:.2f} | {per_step[name] / floor:.2f}x | {ms - floor * 1e3:.2f} |")


SAME = {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3, "top_k": 40, "top_p": 0.9,
        "min_p": 0.05}  # options vLLM's own sampler has
OURS_ONLY = {"DRY": {"dry_multiplier": 0.8, "dry_sequence_breakers": [[3]], "top_k": 0},
             "XTC": {"xtc_probability": 0.5, "xtc_threshold": 0.1, "top_k": 0},
             "top-nσ": {"top_n_sigma": 1.0, "top_k": 0},
             "mirostat 2": {"mirostat": 2, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "top_k": 0}}


def sampling_configs(count: int) -> dict[str, tuple[str, Any]]:
    """`name -> (engine, params(max_tokens))` for `count` requests."""
    def make(engine: str, fields: dict[str, Any], options: dict[str, Any] | None) -> tuple[str, Any]:
        def params(tokens: int) -> list[SamplingParams]:
            return [SamplingParams(temperature=1.0, max_tokens=tokens, ignore_eos=True, detokenize=False, seed=None,
                                   extra_args={"hfbridge": options} if options else None, **fields)
                    for _ in range(count)]
        return engine, params

    configs = {"plain": make("plain", {}, None), "vllm": make("plain", SAME, None),
               "hfbridge": make("hfbridge", {}, SAME)}
    if count == B:
        configs |= {name: make("hfbridge", {}, options) for name, options in OURS_ONLY.items()}
    return configs


def sampling_part(repeats: int = 3, counts: tuple[int, ...] = (1, 8, 32), lengths: tuple[int, ...] = (256, 2048),
                  new: int = 64) -> None:
    from vllm import LLM

    import _tiny_llama

    longest = max(lengths) + new + 8
    folder = _tiny_llama.save(tempfile.mkdtemp(prefix="hfbridge-bench-"), vocab_size=V, max_positions=longest)
    engines: dict[str, Any] = {}
    rows = []
    try:
        for name, processors in (("plain", None), ("hfbridge", [HFBridgeLogitsProcessor])):
            engines[name] = LLM(model=str(folder), dtype="float32", max_model_len=longest,
                                max_num_seqs=B, enforce_eager=True, seed=0, enable_prefix_caching=True,
                                max_num_batched_tokens=B * longest, logits_processors=processors)
        for length in lengths:
            for count in counts:
                prompts = [{"prompt_token_ids": p}
                           for p in _tiny_llama.prompts(count, seed=length, low=length, high=length + 1, vocab_size=V)]
                configs = sampling_configs(count)
                times: dict[str, dict[int, list[float]]] = {name: {1: [], new + 1: []} for name in configs}
                for repeat in range(repeats + 1):  # round-robin; the first round warms up (and fills the prefix cache)
                    for name, (engine, params) in configs.items():
                        for tokens in (1, new + 1):
                            start = time.perf_counter()
                            outputs = engines[engine].generate(prompts, params(tokens), use_tqdm=False)
                            if repeat:
                                times[name][tokens].append(time.perf_counter() - start)
                            assert all(len(out.outputs[0].token_ids) == tokens for out in outputs)
                step = {name: (statistics.median(t[new + 1]) - statistics.median(t[1])) / new
                        for name, t in times.items()}
                rows.append((length, count, step))
                print(f"  history {length}, {count} requests: " + ", ".join(
                    f"{name} {ms * 1e3:.2f} ms" for name, ms in step.items()), flush=True)
    finally:
        for llm in engines.values():
            _tiny_llama.shutdown(llm)
        engines.clear()
        gc.collect()
    print(f"\nsampling part: V={V}, tiny Llama (2 layers, width 64), engine step = (T({new + 1}) - T(1)) / {new}, "
          f"medians of {repeats} round-robin runs (wall time)\n")
    print("| history | requests | plain ms / step | vLLM's own ms / step | hfbridge ms / step | hfbridge / vLLM |"
          " hfbridge's chain - vLLM's |\n|---:|---:|---:|---:|---:|---:|---:|")
    for length, count, step in rows:
        print(f"| {length} | {count} | {step['plain'] * 1e3:.2f} | {step['vllm'] * 1e3:.2f} | "
              f"{step['hfbridge'] * 1e3:.2f} | {step['hfbridge'] / step['vllm']:.2f}x | "
              f"{(step['hfbridge'] - step['vllm']) * 1e3:+.2f} ms |")
    print("\n| history | requests | option | ms / step | over plain |\n|---:|---:|---|---:|---:|")
    for length, count, step in rows:
        for name in OURS_ONLY:
            if name in step:
                print(f"| {length} | {count} | {name} | {step[name] * 1e3:.2f} | "
                      f"{step[name] / step['plain'] - 1:+.0%} |")


def chain_part(counts: tuple[int, ...] = (1, 8, 32), lengths: tuple[int, ...] = (256, 2048), steps: int = 30,
               warmup: int = 5) -> None:
    torch.set_num_threads(1)
    sets = [("vLLM's options", SAME, count) for count in counts] + [(name, options, B)
                                                                   for name, options in OURS_ONLY.items()]
    print(f"\nchain part: V={V}, HFBridgeLogitsProcessor alone, medians of {steps} steps (thread CPU time)\n")
    print("| options | requests | history | ms / step |\n|---|---:|---:|---:|")
    for name, options, count in sets:
        for length in lengths:
            generator = torch.Generator().manual_seed(length)
            params = [SamplingParams(temperature=1.0, max_tokens=NEW, extra_args={"hfbridge": options})
                      for _ in range(count)]
            prompts = [torch.randint(3, V, (length,), generator=generator).tolist() for _ in range(count)]
            outputs: list[list[int]] = [[] for _ in range(count)]
            processor = HFBridgeLogitsProcessor(config(V), torch.device("cpu"), False)
            processor.update_state(BatchUpdate(batch_size=count, removed=[], moved=[],
                                               added=[(i, params[i], prompts[i], outputs[i]) for i in range(count)]))
            times = []
            for step in range(warmup + steps):
                logits = torch.randn(count, V, generator=generator) * 4  # [N, V]
                start = time.thread_time()
                processor.update_state(None)
                processor.apply(logits)
                if step >= warmup:
                    times.append(time.thread_time() - start)
                for output in outputs:
                    output.append(int(torch.randint(3, V, (1,), generator=generator)))
            print(f"| {name} | {count} | {length} | {statistics.median(times) * 1e3:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("processor", "engine", "sampling", "chain", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=3, help="round-robin repeats of the sampling part")
    parser.add_argument("--counts", default="1,8,32", help="numbers of requests of the sampling part")
    parser.add_argument("--lengths", default="256,2048", help="prompt lengths of the sampling part")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, CPU; {time.strftime('%Y-%m-%d')}")
    if args.part in ("processor", "both"):
        processor_part()
    if args.part in ("engine", "both"):
        engine_part()
    if args.part == "chain":
        chain_part(tuple(int(n) for n in args.counts.split(",")), tuple(int(n) for n in args.lengths.split(",")))
    if args.part == "sampling":
        sampling_part(args.repeats, tuple(int(n) for n in args.counts.split(",")),
                      tuple(int(n) for n in args.lengths.split(",")))


if __name__ == "__main__":  # vLLM starts processes: the entry point is guarded
    main()
