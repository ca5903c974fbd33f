"""The vLLM processor's batch step alone (no vLLM needed): how many rows one chain call should take on a CPU.

    python benchmarks/vllm_batch.py                 # 32 requests, V=32000, histories of 256 tokens
    python benchmarks/vllm_batch.py --steps 60

`hfbridge.vllm._batch.Batch` is what the V1 processor's `update_state` / `apply` call: 32 requests of one
option set share a chain, and `Requests.run` hands it the group in slices of at most `_CPU_CALL_SCORES`
scores on a CPU. Each step appends one token to every request's output, then times `Batch.apply` on a copy of
the same `(32, 32000)` logits with thread CPU time (one thread), for each slice size in turn (round-robin),
and prints the medians after 5 warm-up steps. Option sets: XTC, top-n-sigma, DRY, vLLM's six
(repetition / presence / frequency penalties, top-k, top-p, min-p), and mirostat 2, whose requests each run a
chain of their own (one row a call, whatever the slice); beside it, the same mirostat chain called once on all
the rows (what one chain shared by the requests would cost, were their states kept apart).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import torch  # noqa: E402

import hfbridge.vllm._requests as requests_module  # noqa: E402
from hfbridge.vllm._batch import Batch  # noqa: E402

OPTIONS = {
    "XTC": {"xtc_probability": 0.5, "xtc_threshold": 0.1, "top_k": 0},
    "top-n-sigma": {"top_n_sigma": 1.0, "top_k": 0},
    "DRY": {"dry_multiplier": 0.8, "dry_sequence_breakers": [[3]], "top_k": 0},
    "vLLM's six": {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3, "top_k": 40,
                   "top_p": 0.9, "min_p": 0.05},
    "mirostat 2": {"mirostat": 2, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "top_k": 0},
}
SLICES = (15, 17, 19, 21)  # log2 of the scores one call takes: 1, 4, 16 and 65 rows of 32001


def batch_of(options: dict, requests: int, vocab: int, history: int) -> tuple[Batch, list[list[int]]]:
    """A `Batch` holding `requests` requests with `options`, and their live output lists."""
    batch, outputs = Batch(vocab_size=vocab), []
    for index in range(requests):
        params = SimpleNamespace(extra_args={"hfbridge": options}, temperature=1.0, all_stop_token_ids={2}, seed=None)
        output: list[int] = []
        outputs.append(output)
        batch.update(added=[(index, params, torch.randint(0, vocab, (history,)).tolist(), output)])
    return batch, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=32000)
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    batches = {name: batch_of(options, arguments.requests, arguments.vocab, 256) for name, options in OPTIONS.items()}
    logits = torch.randn(arguments.requests, arguments.vocab) * 3  # [B, V]
    times: dict[tuple[str, int], list[float]] = {(name, size): [] for name in OPTIONS for size in SLICES}
    for _ in range(arguments.steps):
        for name, (batch, outputs) in batches.items():
            for output in outputs:
                output.append(int(torch.randint(0, arguments.vocab, ())))
            for size in SLICES:
                requests_module._CPU_CALL_SCORES = 1 << size
                scores = logits.clone()
                start = time.thread_time()
                batch.apply(scores)
                times[(name, size)].append(time.thread_time() - start)
    shared = _one_mirostat_chain(logits, arguments.steps)
    print(f"Batch.apply, {arguments.requests} requests, V={arguments.vocab}, thread CPU ms (median of "
          f"{arguments.steps - 5} steps); slice = 2^k scores per chain call")
    print("| options | " + " | ".join(f"2^{size}" for size in SLICES) + " |")
    print("|---|" + "---:|" * len(SLICES))
    for name in OPTIONS:
        cells = " | ".join(f"{statistics.median(times[(name, size)][5:]) * 1e3:.2f}" for size in SLICES)
        print(f"| {name} | {cells} |")
    print(f"\nmirostat 2, one chain called once on all {arguments.requests} rows: {shared:.2f} ms")


def _one_mirostat_chain(logits: torch.Tensor, steps: int) -> float:
    """Median thread CPU ms of one mirostat 2 chain's `Sampler.process` on all the rows, one token more a step."""
    from hfbridge.vllm._sampling_params import build_sampler, check_request

    params = SimpleNamespace(extra_args={"hfbridge": OPTIONS["mirostat 2"]}, temperature=1.0, all_stop_token_ids={2},
                             seed=None)
    sampler = build_sampler(check_request(params), prompt_length=None, eos_token_id=[2], tokenizer=None,
                            generator=None)
    rows, vocab = logits.shape
    ids = torch.randint(0, vocab, (rows, 256))  # [B, T]
    times = []
    for _ in range(steps):
        ids = torch.cat([ids, torch.randint(0, vocab, (rows, 1))], dim=1)
        scores = logits.clone()
        start = time.thread_time()
        sampler.process(ids, scores)
        times.append(time.thread_time() - start)
    return statistics.median(times[5:]) * 1e3


if __name__ == "__main__":
    main()
