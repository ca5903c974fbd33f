"""The replay's cost next to the generation's: `hfbridge.replay` over 512 tokens x 8 rows.

    python benchmarks/replay.py            # 3 repeats
    python benchmarks/replay.py --quick    # 1 repeat, 128 tokens

One thread, this thread's CPU time (`time.thread_time()`), the variants run round-robin, medians.
A tiny random `LlamaForCausalLM` (V=8192) generates 512 tokens for 8 rows; then, for each option set:

- `chain`: the generation's processors on the same logits: a fresh `Sampler` with the options,
  `process` then `choose` at each step over the recorded sequences (what `generate` runs per step
  besides the model);
- `forward`: one forward of the model over the whole sequences (what a trainer runs anyway);
- `replay(logits=)`: the replay from the recorded logits (`output_logits`);
- `replay(teacher_forced)`: the replay running that one forward itself.

Goal: `replay(teacher_forced)` <= 2 x `chain` + `forward`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
from hfbridge import Sampler, generate, replay  # noqa: E402

OPTION_SETS = {
    "HF chain (rep 1.1, T 0.8, top-k 50, top-p 0.9)": dict(repetition_penalty=1.1, temperature=0.8, top_k=50,
                                                            top_p=0.9),
    "samplers (DRY 0.8, min-p 0.05, XTC 0.5)": dict(dry_multiplier=0.8, dry_sequence_breakers=[], min_p=0.05,
                                                      xtc_probability=0.5, xtc_threshold=0.1),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    new, repeats, rows, vocab = (128, 1, 8, 8192) if args.quick else (512, 3, 8, 8192)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                         bos_token_id=None, eos_token_id=None, pad_token_id=None)).eval()
    prompts = torch.randint(0, vocab, (rows, 8), generator=torch.Generator().manual_seed(1))
    print(f"{rows} rows x {new} tokens, V={vocab}, tiny Llama (2 layers, hidden 64), one thread, CPU time, "
          f"median of {repeats}")
    for name, options in OPTION_SETS.items():
        options = dict(options, do_sample=True, max_new_tokens=new)
        out = generate(model, prompts, generator=torch.Generator().manual_seed(2), return_dict_in_generate=True,
                       output_logits=True, **options)
        sequences, logits = out.sequences, out.logits

        def chain() -> None:
            sampler = Sampler(generator=torch.Generator().manual_seed(2), prompt_length=prompts.shape[1],
                              **{k: v for k, v in options.items() if k != "max_new_tokens"})
            for step, step_logits in enumerate(logits):
                scores = sampler.process(sequences[:, :prompts.shape[1] + step], step_logits.to(torch.float32,
                                                                                                copy=True))
                sampler.choose(scores, raw=step_logits)

        def forward() -> None:
            with torch.no_grad():
                model(input_ids=sequences, attention_mask=torch.ones_like(sequences))

        def from_logits() -> None:
            replay(None, sequences, prompt_length=prompts.shape[1], logits=logits,
                   generator=torch.Generator().manual_seed(2), **options)

        def teacher_forced() -> None:
            replay(model, sequences, prompt_length=prompts.shape[1], teacher_forced=True,
                   generator=torch.Generator().manual_seed(2), **options)

        variants = {"chain": chain, "forward": forward, "replay(logits=)": from_logits,
                    "replay(teacher_forced)": teacher_forced}
        times: dict[str, list[float]] = {key: [] for key in variants}
        for _ in range(repeats):
            for key, run in variants.items():  # round-robin
                start = time.thread_time()
                run()
                times[key].append(time.thread_time() - start)
        median = {key: statistics.median(values) for key, values in times.items()}
        budget = 2 * median["chain"] + median["forward"]
        print(f"\n{name}")
        for key, value in median.items():
            print(f"  {key:24s} {value * 1000:9.1f} ms")
        print(f"  replay(logits=) / chain: {median['replay(logits=)'] / median['chain']:.2f}x; "
              f"replay(teacher_forced) / (2 x chain + forward): {median['replay(teacher_forced)'] / budget:.2f} "
              "(goal <= 1)")


if __name__ == "__main__":
    main()
