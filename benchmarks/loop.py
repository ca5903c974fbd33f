"""Tokens per second of the whole loop: `hfbridge.generate` vs `model.generate` on a tiny Llama.

    python benchmarks/loop.py            # batch 4, 64 new tokens, 5 repeats
    python benchmarks/loop.py --quick

The model is a `LlamaForCausalLM` with random weights built from a small `LlamaConfig` (nothing is
downloaded), called with its KV cache by both: HF's own loop, and hfbridge's through `ReturnsCache`.
The runs alternate, and each figure is the median of the repeats.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from hfbridge import ReturnsCache, generate

MODES = {
    "greedy": dict(do_sample=False),
    "sampling": dict(do_sample=True, temperature=0.7, top_k=50, top_p=0.9),
    "sampling (top_k=0)": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0),
}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 repeats, 32 new tokens")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--prompt", type=int, default=16)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    repeats, new = (2, 32) if args.quick else (5, 64)
    model = tiny_llama(args.vocab)
    adapter = cached(model)
    prompt = torch.randint(3, args.vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
    runs = {
        "model.generate": lambda o: model.generate(prompt, max_new_tokens=new, min_new_tokens=new, **o),
        "hfbridge.generate": lambda o: generate(adapter, prompt, max_new_tokens=new, min_new_tokens=new, **o),
        "hfbridge.generate fast": lambda o: generate(adapter, prompt, max_new_tokens=new, min_new_tokens=new,
                                                     fast=True, **o),
    }
    print(f"tiny LlamaForCausalLM (2 layers, hidden 64, vocab {args.vocab}), batch {args.batch}, prompt "
          f"{args.prompt}, {new} new tokens; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"median of {repeats}\n")
    print("| mode | model.generate tok/s | hfbridge.generate tok/s | fast=True tok/s | hfbridge / HF | fast / HF |")
    print("|---|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for mode, options in MODES.items():
            names = [n for n in runs if options["do_sample"] or "fast" not in n]
            seconds = {n: [] for n in names}
            for n in names:  # warm-up
                runs[n](options)
            for _ in range(repeats):
                for n in names:
                    start = time.perf_counter()
                    out = runs[n](options)
                    seconds[n].append(time.perf_counter() - start)
                    assert out.shape == (args.batch, args.prompt + new), (n, out.shape)
            rate = {n: args.batch * new / statistics.median(s) for n, s in seconds.items()}
            hf, ours = rate["model.generate"], rate["hfbridge.generate"]
            fast = rate.get("hfbridge.generate fast")
            print(f"| {mode} | {hf:.0f} | {ours:.0f} | {f'{fast:.0f}' if fast else '-'} | {ours / hf:.2f} | "
                  f"{f'{fast / hf:.2f}' if fast else '-'} |", flush=True)


if __name__ == "__main__":
    main()
