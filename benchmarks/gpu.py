"""hfbridge on a CUDA device: each sampler's cost in reads of the logits, host syncs per step, CUDA graphs.

    python benchmarks/gpu.py              # every section (needs a CUDA device)
    python benchmarks/gpu.py --quick      # fewer repeats

Sections:
1. **cost**: every sampler of `hfbridge.processors` and HF's own warpers, timed with CUDA events
   (the median of the repeats) on realistic logits, in units of one read of the logits
   (`logits.amax(-1)`); B=1 V=32000 and B=32 V=128256, 1,024 tokens of history.
2. **syncs**: host-device synchronisations per call, counted by torch's own sync debug mode
   (`torch.cuda.set_sync_debug_mode("warn")`, one warning per synchronising operation), for each
   sampler and for `Sampler(fast=True).next_tokens(..., check=False)` with several option sets.
3. **graph**: `Sampler(fast=True)` captured in a CUDA graph and replayed: tokens inside the kept set of
   exact mode, and the time per step eager vs replayed.
4. **parity**: on the GPU, exact mode equals HF's chain for greedy and for the same seed; every fast
   token lies in exact mode's kept set.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from collections.abc import Callable
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from samplers import history, realistic

from hfbridge import Sampler
from hfbridge._step.fast.top_p.compiled import top_p_keep
from hfbridge._step.fast.top_p.device_sort import sorted_top_p_keep
from hfbridge.processors import (
    DRYLogitsProcessor,
    DynamicTemperatureLogitsWarper,
    MirostatLogitsWarper,
    PresenceFrequencyPenaltyLogitsProcessor,
    SmoothingLogitsWarper,
    TopNSigmaLogitsWarper,
    XTCLogitsWarper,
)

PROCESSORS: dict[str, Callable[[int], Callable]] = {
    "DRY (0.8, token breakers)": lambda prompt: DRYLogitsProcessor(0.8, sequence_breakers=[[13], [198]]),
    "XTC (0.1, 1.0)": lambda prompt: XTCLogitsWarper(0.1, 1.0),
    "top-n-sigma (1.0)": lambda prompt: TopNSigmaLogitsWarper(1.0),
    "presence/frequency (0.5, 0.5)": lambda prompt: PresenceFrequencyPenaltyLogitsProcessor(
        0.5, 0.5, prompt_length=prompt),
    "dynamic temperature (0.8 +- 0.5)": lambda prompt: DynamicTemperatureLogitsWarper(0.8, 0.5),
    "smoothing (0.3)": lambda prompt: SmoothingLogitsWarper(0.3),
    "mirostat 2 (5, 0.1)": lambda prompt: MirostatLogitsWarper(5.0, 0.1),
    "HF top-k (50)": lambda prompt: TopKLogitsWarper(50),
    "HF top-p (0.9)": lambda prompt: TopPLogitsWarper(0.9),
    "HF min-p (0.05)": lambda prompt: MinPLogitsWarper(0.05),
    "HF repetition penalty (1.1)": lambda prompt: RepetitionPenaltyLogitsProcessor(1.1),
}

FAST_OPTIONS: dict[str, dict] = {
    "top-p 0.9, T 0.8": dict(do_sample=True, temperature=0.8, top_p=0.9, top_k=0),
    "top-k 40, T 0.8": dict(do_sample=True, temperature=0.8, top_k=40),
    "min-p 0.05": dict(do_sample=True, min_p=0.05, top_k=0),
    "llama.cpp chain": dict(do_sample=True, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5,
                            penalty_last_n=64, dry_multiplier=0.8, dry_sequence_breakers=[[13]], top_k=40,
                            top_p=0.95, min_p=0.05,
                            temperature=0.8),
    "per-row T and top-p": "per-row",  # filled in per batch size
}


def event_times(call: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of `call` on the GPU, each timed with a pair of CUDA events."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def count_syncs(call: Callable[[], object]) -> int:
    """Synchronising CUDA operations in one `call`, as torch's sync debug mode reports them."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # torch's first use of the mode also warns that it "is a prototype feature": not a sync
    return sum("synchroniz" in str(w.message).lower() and "prototype" not in str(w.message) for w in caught)


def inputs(rows: int, vocab: int, length: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    scores = realistic(rows, vocab, generator).cuda()
    ids = history(rows, length, vocab, generator).cuda()
    return scores, ids


def fast_options(name: str, rows: int) -> dict:
    options = FAST_OPTIONS[name]
    if options == "per-row":
        return dict(do_sample=True, top_k=0, temperature=[0.5 + 0.05 * i for i in range(rows)],
                    top_p=[0.8 + 0.005 * i for i in range(rows)])
    return dict(options)


def measured_row(name: str, call: Callable[[], object], floor: float, repeats: int) -> str:
    """A table row: `call` warmed up, timed (ms and reads of the logits) and its host syncs counted."""
    for _ in range(3):
        call()
    ms = event_times(call, repeats)
    return f"| {name} | {ms:.4f} | {ms / floor:.1f} | {count_syncs(call)} |"


def cost_and_syncs(repeats: int) -> None:
    print("## cost (CUDA events, median) and host syncs per call\n")
    for rows, vocab in [(1, 32000), (32, 128256)]:
        scores, ids = inputs(rows, vocab)
        floor = event_times(lambda: scores.amax(-1), repeats)
        print(f"B={rows} V={vocab}, 1024 tokens of history: one read of the logits (amax) = {floor:.4f} ms\n")
        print("| processor | ms | reads of the logits | host syncs per call |")
        print("|---|---:|---:|---:|")
        for name, make in PROCESSORS.items():
            processor = make(512)
            if isinstance(processor, MirostatLogitsWarper):
                def call(processor=processor):
                    processor.reset()
                    processor(ids[:, :-1], scores)
                    return processor(ids, scores)  # the update path reads the token chosen
            else:
                def call(processor=processor):
                    return processor(ids, scores)
            print(measured_row(name, call, floor, repeats))
        print()
        print("| `Sampler(fast=True).next_tokens(check=False)` | ms | reads | host syncs per step |")
        print("|---|---:|---:|---:|")
        for name in FAST_OPTIONS:
            sampler = Sampler(fast=True, **fast_options(name, rows))
            def step(sampler=sampler):
                return sampler.next_tokens(ids, scores, check=False)
            print(measured_row(name, step, floor, repeats))
        print()


def top_p_routes(repeats: int) -> None:
    print("## top-p on the device: HF's sort (the fast path's route) vs the radix select vs HF's warper\n")
    print("| B | V | amax ms | device sort ms | radix select ms | HF TopPLogitsWarper ms | sort = HF's set |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for rows, vocab in [(1, 32000), (8, 50257), (32, 128256)]:
        scores, _ = inputs(rows, vocab, 8)
        scores = scores / 0.8
        probs = scores.softmax(-1)
        floor = event_times(lambda: scores.amax(-1), repeats)
        sort = event_times(lambda: sorted_top_p_keep(scores, 0.9, 1), repeats)
        radix = event_times(lambda: top_p_keep(scores, probs, 0.9, 1, route="radix"), repeats)
        warper = TopPLogitsWarper(0.9)
        hf = event_times(lambda: warper(None, scores.clone()), repeats)
        same = bool(torch.equal(sorted_top_p_keep(scores, 0.9, 1), warper(None, scores.clone()).isfinite()))
        print(f"| {rows} | {vocab} | {floor:.4f} | {sort:.4f} | {radix:.4f} | {hf:.4f} | {same} |")
    print()


def generate_syncs() -> None:
    print("## host syncs per step of `generate` (a tiny random Llama on the GPU, B=4, 32 new tokens)\n")
    from transformers import LlamaConfig, LlamaForCausalLM

    from hfbridge import generate

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).cuda().eval()
    prompt = torch.randint(0, 32000, (4, 12), device="cuda")
    mask = torch.ones_like(prompt)
    print("| options | host syncs per step | `model.generate`'s | tokens equal to `model.generate` |")
    print("|---|---:|---:|---|")
    for name, options in [("greedy", dict(do_sample=False)),
                          ("sampling, fast, top-p 0.9", dict(do_sample=True, top_p=0.9, fast=True)),
                          ("sampling, exact, top-k 50", dict(do_sample=True, top_k=50))]:
        def run(new, options=options):
            torch.manual_seed(1)
            return generate(model, prompt, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, **options)
        run(4)
        per_step = (count_syncs(lambda: run(33)) - count_syncs(lambda: run(1))) / 32
        hf_options = {k: v for k, v in options.items() if k != "fast"}

        def hf_run(new, hf_options=hf_options):
            torch.manual_seed(1)
            return model.generate(prompt, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, pad_token_id=0,
                                  **hf_options)
        hf_run(4)
        hf_per_step = (count_syncs(lambda: hf_run(33)) - count_syncs(lambda: hf_run(1))) / 32
        equal = "-"
        if not options.get("fast"):
            equal = str(bool(torch.equal(torch.as_tensor(run(16)), hf_run(16))))
        print(f"| {name} | {per_step:.2f} | {hf_per_step:.2f} | {equal} |")
    print()


def where_syncs() -> None:
    """Where each processor that synchronises does: the first synchronising call's place in hfbridge."""
    import traceback

    print("## where the host syncs are\n")
    for rows, vocab in [(1, 32000), (32, 128256)]:
        scores, ids = inputs(rows, vocab)
        for name, make in PROCESSORS.items():
            processor = make(512)
            for _ in range(3):
                processor(ids, scores)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                processor(ids, scores)
            except RuntimeError:
                frames = [f for f in traceback.extract_tb(sys.exc_info()[2]) if "hfbridge" in f.filename]
                place = "; ".join(f"{Path(f.filename).name}:{f.lineno} {f.line}" for f in frames[-2:])
                print(f"- B={rows} {name}: {place}")
            finally:
                torch.cuda.set_sync_debug_mode("default")
    print()


def graph(repeats: int) -> None:
    print("## CUDA graph of the fast step\n")
    print("| options | B | V | eager ms | replay ms | tokens in exact's kept set |")
    print("|---|---:|---:|---:|---:|---|")
    for rows, vocab in [(1, 32000), (32, 128256)]:
        scores, ids = inputs(rows, vocab)
        for name in FAST_OPTIONS:
            options = fast_options(name, rows)
            sampler = Sampler(fast=True, **options)
            static_scores, static_ids = scores.clone(), ids.clone()
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        sampler.next_tokens(static_ids, static_scores, check=False)
                torch.cuda.current_stream().wait_stream(side)
                cuda_graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(cuda_graph):
                    tokens = sampler.next_tokens(static_ids, static_scores, check=False)
                drawn = []
                for _ in range(20):
                    cuda_graph.replay()
                    drawn.append(tokens.clone())
                exact = Sampler(**options)
                kept = exact.process(ids, scores.clone()).isfinite()  # [B, V]
                inside = all(bool(kept.gather(1, t[:, None]).all()) for t in drawn)
                varied = len({tuple(t.tolist()) for t in drawn}) > 1
                eager = event_times(lambda: sampler.next_tokens(static_ids, static_scores, check=False), repeats)
                replay = event_times(cuda_graph.replay, repeats)
                verdict = f"{inside} ({'draws vary' if varied else 'draws all equal'})"
                print(f"| {name} | {rows} | {vocab} | {eager:.4f} | {replay:.4f} | {verdict} |")
            except Exception as error:  # report and go on: the table says what failed
                print(f"| {name} | {rows} | {vocab} | - | - | capture failed: {type(error).__name__}: "
                      f"{str(error).splitlines()[0][:120]} |")
    print()


def parity() -> None:
    print("## parity on the GPU\n")
    scores, ids = inputs(8, 50257, 64)
    hf = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2), TemperatureLogitsWarper(0.7),
                              TopKLogitsWarper(50), TopPLogitsWarper(0.9)])
    expected = hf(ids, scores.clone())
    got = Sampler(do_sample=True, repetition_penalty=1.2, temperature=0.7, top_k=50, top_p=0.9).process(
        ids, scores.clone())
    print("exact processors equal HF's chain:", bool(torch.equal(expected, got)))
    greedy = Sampler()(scores, ids)
    print("greedy equals argmax:", bool(torch.equal(greedy, scores.argmax(-1))))
    generator = torch.Generator("cuda").manual_seed(1)
    drawn = torch.multinomial(expected.softmax(-1), 1, generator=generator).squeeze(1)
    ours = Sampler(do_sample=True, repetition_penalty=1.2, temperature=0.7, top_k=50, top_p=0.9,
                   generator=torch.Generator("cuda").manual_seed(1))(scores, ids)
    print("exact draw equals HF's draw for the same seed:", bool(torch.equal(drawn, ours)))
    for name in FAST_OPTIONS:
        options = fast_options(name, 8)
        kept = Sampler(**options).process(ids, scores.clone()).isfinite()
        fast = Sampler(fast=True, **options)
        inside = all(bool(kept.gather(1, fast(scores, ids)[:, None]).all()) for _ in range(50))
        print(f"fast tokens in exact's kept set ({name}): {inside}")
    per_row_parity(scores, ids)
    per_row_parity(*inputs(32, 128256, 64))
    print()


def per_row_parity(scores: torch.Tensor, ids: torch.Tensor) -> None:
    """Per-row temperature and top-p on the device: one fast draw for the batch, and its scores equal
    exact mode's (each row's own HF warpers) bit for bit, kept sets included."""
    from hfbridge._step.fast.fast_path import fast_scores

    rows = scores.shape[0]
    options = fast_options("per-row T and top-p", rows)
    sampler = Sampler(fast=True, **options)
    sampler(scores, ids)  # builds its per-row plan
    groups = sampler._rows.plan.fast_groups(scores.device)
    exact = Sampler(**options).process(ids, scores.clone())  # [B, V]
    equal, ties, rounding = True, 0, 0
    for _, index, processors, _ in groups:
        fast = fast_scores(ids.index_select(0, index), scores.index_select(0, index).clone(), processors)
        for row, got, want in zip(index.tolist(), fast, exact.index_select(0, index)):
            if torch.equal(got, want):
                continue
            # the two places where HF's own answer rests on what it leaves open (docs/fast_path.md)
            differ = got.isfinite() ^ want.isfinite()
            both = got.isfinite() & want.isfinite()
            values = torch.equal(got[both], want[both])
            raw = scores[row]
            if bool((raw[differ] == raw[differ][0]).all()) and int(got.isfinite().sum()) == int(
                    want.isfinite().sum()):  # exactly equal scores straddling the cut: HF's sort orders them
                ties += values
            elif int(differ.sum()) == 1 and _at_the_cut(raw / options["temperature"][row], options["top_p"][row],
                                                         int(differ.nonzero()[0, 0])):
                rounding += values  # HF's float32 running sum at the token is within rounding of `1 - top_p`
            else:
                equal = False
            equal &= values
    print(f"per-row T and top-p, {rows} rows: {len(groups)} fast draw(s); fast scores equal exact's: {equal} "
          f"(rows that differ only where HF's answer is open: {ties} by exact ties at the cut, {rounding} by "
          "the running sum's rounding at the cut)")


def _at_the_cut(row: torch.Tensor, top_p: float, token: int) -> bool:
    """Whether the running sum HF compares at `token` (probabilities below it, ascending) is within float32
    rounding of `1 - top_p`: then the batch's layout (HF's float32 sum on a device) decides that token."""
    probs = row.double().softmax(-1)
    below = probs[row < row[token]].sum() + probs[token]
    return abs(float(below) - (1 - top_p)) < 1e-5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA device")
    repeats = 11 if args.quick else 51
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    for section in (parity, lambda: top_p_routes(repeats), lambda: cost_and_syncs(repeats), where_syncs,
                    generate_syncs, lambda: graph(repeats)):
        try:
            section()
        except Exception as error:
            print(f"section failed: {type(error).__name__}: {error}\n")


if __name__ == "__main__":
    main()
