"""Guidance and watermarking: `hfbridge.generate(ReturnsCache(...))` against HF's `model.generate`.

    python benchmarks/guidance_watermark.py

A tiny random `LlamaForCausalLM` (tests/_tiny_models.py), 2 prompts of 6 tokens, 32 new tokens,
sampling; plain, `guidance_scale=1.5` (one unconditional call per step on both sides), a green-list
watermark and a SynthID watermark. One thread, this thread's CPU time, round-robin, medians of 7.
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import time
import warnings

import torch
from transformers import SynthIDTextWatermarkingConfig, WatermarkingConfig
from transformers.utils import logging

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from hfbridge import ReturnsCache, generate

from _tiny_models import returns_cache_callable, tiny_llama

CASES = {"plain": {}, "guidance": dict(guidance_scale=1.5), "green": dict(watermarking_config=WatermarkingConfig()),
         "synthid": dict(watermarking_config=SynthIDTextWatermarkingConfig(ngram_len=5, keys=[1, 2, 3, 4]))}


def main(repeats: int = 7) -> None:
    warnings.filterwarnings("ignore")
    logging.set_verbosity_error()
    torch.set_num_threads(1)
    hf = tiny_llama()
    prompts = torch.tensor([[5, 9, 13, 2, 7, 21], [40, 3, 3, 18, 4, 11]])
    adapter = ReturnsCache(returns_cache_callable(hf))
    times: dict[tuple[str, str], list[float]] = {(case, who): [] for case in CASES for who in ("hf", "hfbridge")}
    for _ in range(repeats):
        for case, options in CASES.items():
            for who in ("hf", "hfbridge"):
                torch.manual_seed(0)
                start = time.thread_time()
                with torch.no_grad():
                    if who == "hf":
                        hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=32,
                                    do_sample=True, **options)
                    else:
                        generate(adapter, prompts, max_new_tokens=32, do_sample=True, **options)
                times[(case, who)].append(time.thread_time() - start)
    for case in CASES:
        theirs, ours = statistics.median(times[(case, "hf")]), statistics.median(times[(case, "hfbridge")])
        print(f"{case:9s} HF {theirs * 1e3:7.1f} ms  hfbridge {ours * 1e3:7.1f} ms  ratio {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
