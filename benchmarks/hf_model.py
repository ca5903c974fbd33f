"""A transformers model passed straight to hfbridge.generate (`HFModel`) against its own `model.generate`.

    python benchmarks/hf_model.py                 # 7 rounds
    python benchmarks/hf_model.py --repeats 3     # quicker
    python benchmarks/hf_model.py --recompute     # also the plain-callable (Recompute) path, for scale

A random 6-layer `GPT2LMHeadModel` (V=50257, n_embd=128, 4 heads, 128 positions; random weights,
seed 0), a 32-token prompt, 48 new tokens (greedy, no eos, so every run makes all 48), B=1 and
B=8. One thread (`torch.set_num_threads(1)`), this thread's CPU time (`time.thread_time`), the
variants of each batch size run round-robin, medians. Each variant's tokens are checked equal to
`model.generate`'s first. Target: `hfbridge.generate(model)` within 10% of `model.generate`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hfbridge import Recompute, generate

PROMPT, NEW, VOCAB = 32, 48, 50257


def build() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=128, n_layer=6, n_head=4,
                        bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def variants(model: GPT2LMHeadModel, recompute: bool) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    options = dict(max_new_tokens=NEW, do_sample=False)
    found: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "model.generate": lambda ids: model.generate(ids, attention_mask=torch.ones_like(ids), **options),
        "hfbridge.generate(model)": lambda ids: generate(model, ids, attention_mask=torch.ones_like(ids), **options),
    }
    if recompute:
        def plain(input_ids: torch.Tensor) -> torch.Tensor:
            return model(input_ids, use_cache=False).logits
        found["hfbridge.generate(Recompute(model))"] = lambda ids: generate(Recompute(plain), ids, **options)
    return found


def timed(run: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor) -> float:
    start = time.thread_time()
    run(ids)
    return time.thread_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="rounds (default: %(default)s)")
    parser.add_argument("--recompute", action="store_true", help="also time the Recompute path")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    warnings.simplefilter("ignore")
    model = build()
    runs = variants(model, args.recompute)
    print(f"GPT-2, 6 layers, n_embd 128, V={VOCAB}; prompt {PROMPT}, {NEW} new tokens, greedy; one thread, "
          f"thread time, median of {args.repeats} round-robin rounds")
    print(f"{'B':>2}  {'variant':38} {'median s':>9}  {'/ model.generate':>16}")
    missed = False
    for batch in (1, 8):
        ids = torch.randint(1, VOCAB, (batch, PROMPT), generator=torch.Generator().manual_seed(batch))
        expected = runs["model.generate"](ids)
        for name, run in runs.items():  # warm up, and the tokens must be the same
            if not torch.equal(run(ids), expected):
                raise SystemExit(f"{name} gave other tokens than model.generate at B={batch}")
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                times[name].append(timed(run, ids))
        base = statistics.median(times["model.generate"])
        for name in runs:
            median = statistics.median(times[name])
            ratio = median / base
            verdict = ""
            if name == "hfbridge.generate(model)":
                verdict = "  PASS (<= 1.10)" if ratio <= 1.10 else "  MISS (> 1.10)"
                missed = missed or ratio > 1.10
            print(f"{batch:>2}  {name:38} {median:9.3f}  {ratio:15.2f}x{verdict}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
