"""Banned strings: what they add to each generated token, at 200, 2,000 and 8,000 tokens.

    python benchmarks/banned.py             # 5 rounds; the whole-decode reference at 200 and 2,000 tokens
    python benchmarks/banned.py --quick     # 3 rounds, no 8,000-token row for the reference
    python benchmarks/banned.py --full-8000 # the whole-decode reference at 8,000 tokens too (about a minute a run)
    python benchmarks/banned.py --only 2    # one table

One thread, this thread's CPU time (`time.thread_time`), the variants of each length run round-robin (the
order rotates from round to round), medians. The tokenizer is a byte-level BPE (GPT-2's kind) trained here on
this repository's docs (vocabulary 4,000); the bans never trigger (checked: no rollback, the same tokens as
without bans), so every token is checked and nothing is taken back:

- strings: `banned_strings=["shivers down her spine", "a testament to", "tapestry", "delve"]` (read from the
  match's start: only the text from the search's start is decoded and searched);
- + \\b pattern: the same and `banned_regex=[r"\\bdelve\\b"]` (reads one character before the match);
- lookbehind: `banned_regex=[r"(?<=the )tapestry"]` (may read any text before its match: the whole text is
  joined at every step, a copy; the decoding is still a window);
- whole decode: the strings, with the whole text decoded at every step (`FullText`, what banned strings did
  before the window: `banned_decode.py`);
- hooks only: the strings, with `observe` (decoding and searching) replaced by nothing: what the loop does for
  bans besides the text (one host read per step, the hooks of `banned_loop.py`).

Tables:

1. A one-row-lookup model (a bigram table of the docs' tokens plus noise, `model(ids) -> table[ids[:, -1:]]`,
   sampling with top-k 50): the cheapest model, so the bans' own cost per token shows. Cost per token =
   (time with bans - time without) / tokens; target: flat from 200 to 8,000 tokens.
2. A tiny `LlamaForCausalLM` (2 layers, hidden 64) with its KV cache, 2,000 new tokens: with / without bans.
   Target: <= 1.05.
3. The check alone: `BannedStrings.observe` fed the tokens of a generation (no model, no loop): the text's
   own cost per token (decoding and searching), at 200, 2,000 and 8,000 tokens.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from hfbridge import BannedStrings, ReturnsCache, generate  # noqa: E402
from hfbridge._generate.banned_decode import FullText  # noqa: E402

STRINGS = ["shivers down her spine", "a testament to", "tapestry", "delve"]
VARIANTS = {
    "strings": dict(strings=STRINGS),
    "+ \\b pattern": dict(strings=STRINGS, regex=[r"\bdelve\b"]),
    "lookbehind": dict(regex=[r"(?<=the )tapestry"]),
    "whole decode": dict(strings=STRINGS),
    "hooks only": dict(strings=STRINGS),
}


def tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the docs (the words of a real text, no download)."""
    texts = [path.read_text() for path in sorted((ROOT / "docs").glob("*.md"))] + [(ROOT / "README.md").read_text()]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


def bigram_model(tok: PreTrainedTokenizerFast) -> Callable[[torch.Tensor], torch.Tensor]:
    vocab = len(tok)
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0))  # [V, V]
    for path in sorted((ROOT / "docs").glob("*.md")):
        ids = torch.tensor(tok(path.read_text()).input_ids)
        table[ids[:-1], ids[1:]] += 5.0

    def model(ids):  # [B, T] -> [B, 1, V]
        return table[ids[:, -1:]]
    return model


def bans_for(name: str, tok: PreTrainedTokenizerFast) -> BannedStrings:
    bans = BannedStrings(tok, **VARIANTS[name])
    if name == "whole decode":
        bans._text = lambda: FullText(tok.decode)  # type: ignore[method-assign]
    if name == "hooks only":  # the loop's work for bans (a read per step, the hooks), no text decoded or searched
        bans.observe = lambda column, live, final: None  # type: ignore[method-assign]
    return bans


def rounds(runs: dict[str, Callable[[], object]], repeats: int) -> list[dict[str, float]]:
    """Seconds of each run in each round; the order rotates from round to round (one warm-up each)."""
    for run in runs.values():
        run()
    names, out = list(runs), []
    for index in range(repeats):
        seconds = {}
        for name in names[index % len(names):] + names[: index % len(names)]:
            start = time.thread_time()
            runs[name]()
            seconds[name] = time.thread_time() - start
        out.append(seconds)
    return out


def per_token(tok, repeats: int, lengths: tuple[int, ...], whole_upto: int) -> None:
    model = bigram_model(tok)
    prompt = torch.tensor([tok("The loop").input_ids])
    print(f"### 1. Cost per token: a one-row-lookup model (V={len(tok)}), B=1, sampling top-k 50\n")
    print(f"{repeats} rounds, rotating order, medians; µs per token = (with bans - without) / tokens, paired per "
          "round.\n")
    print("| tokens | without bans µs/token | bans | with bans µs/token | cost µs/token | with / without |")
    print("|---:|---:|---|---:|---:|---:|")
    costs: dict[str, dict[int, float]] = {name: {} for name in VARIANTS}
    for new in lengths:
        def run(name: str | None, new: int = new) -> torch.Tensor:
            extra = {} if name is None else dict(banned_strings=bans_for(name, tok))
            return generate(model, prompt, max_new_tokens=new, do_sample=True, top_k=50,
                            generator=torch.Generator().manual_seed(1), **extra)
        names = [name for name in VARIANTS if name != "whole decode" or new <= whole_upto]
        plain = run(None)
        for name in names:  # the bans never trigger: the same tokens
            bans = bans_for(name, tok)
            out = generate(model, prompt, max_new_tokens=new, do_sample=True, top_k=50, banned_strings=bans,
                           generator=torch.Generator().manual_seed(1))
            assert torch.equal(out, plain) and not bans.rewinds, name
        measured = rounds({"none": lambda: run(None), **{name: (lambda n=name: run(n)) for name in names}}, repeats)
        base = statistics.median(r["none"] for r in measured) / new
        for name in names:
            with_bans = statistics.median(r[name] for r in measured) / new
            cost = statistics.median((r[name] - r["none"]) / new for r in measured)
            ratio = statistics.median(r[name] / r["none"] for r in measured)
            costs[name][new] = cost
            print(f"| {new} | {base * 1e6:.0f} | {name} | {with_bans * 1e6:.0f} | {cost * 1e6:.1f} | {ratio:.3f} |",
                  flush=True)
    print("\nCost per token at the longest length / at the shortest (flat: about 1):\n")
    for name, by_length in costs.items():
        if len(by_length) > 1:
            first, last = min(by_length), max(by_length)
            print(f"- {name}: {by_length[last] / by_length[first]:.2f} ({first} -> {last} tokens)")
    print()


def llama_ratio(tok, repeats: int, new: int) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=new + 64)
    llama = LlamaForCausalLM(config).eval()

    name = "cache" if "cache" in inspect.signature(llama.forward).parameters else "past_key_values"  # 5.24 renamed

    def step(input_ids, cache):
        out = llama(input_ids=input_ids, use_cache=True, logits_to_keep=1, **{name: cache})
        return out.logits, getattr(out, name)
    adapter = ReturnsCache(step)
    prompt = torch.tensor([tok("The loop").input_ids])

    def run(name: str | None) -> torch.Tensor:
        extra = {} if name is None else dict(banned_strings=bans_for(name, tok))
        with torch.no_grad():
            return generate(adapter, prompt, max_new_tokens=new, do_sample=True, top_k=50,
                            generator=torch.Generator().manual_seed(1), **extra)
    names = ["strings", "+ \\b pattern"]
    measured = rounds({"none": lambda: run(None), **{name: (lambda n=name: run(n)) for name in names}}, repeats)
    base = statistics.median(r["none"] for r in measured) / new
    print(f"### 2. A tiny LlamaForCausalLM (2 layers, hidden 64, V={len(tok)}) with its KV cache, {new} new tokens, "
          "B=1\n")
    print("| bans | without µs/token | with µs/token | with / without | target <= 1.05 |")
    print("|---|---:|---:|---:|---|")
    for name in names:
        ratio = statistics.median(r[name] / r["none"] for r in measured)
        with_bans = statistics.median(r[name] for r in measured) / new
        print(f"| {name} | {base * 1e6:.0f} | {with_bans * 1e6:.0f} | {ratio:.3f} | "
              f"{'PASS' if ratio <= 1.05 else 'MISS'} |", flush=True)
    print()


def check_alone(tok, repeats: int, lengths: tuple[int, ...]) -> None:
    """`BannedStrings.observe` alone (decode the window, search), fed the tokens of a generation, one row."""
    model = bigram_model(tok)
    prompt = torch.tensor([tok("The loop").input_ids])
    longest = generate(model, prompt, max_new_tokens=max(lengths), do_sample=True, top_k=50,
                       generator=torch.Generator().manual_seed(1))[0, prompt.shape[1]:].tolist()
    print("### 3. The check alone: `BannedStrings.observe` per token, fed a generation's tokens (no model, no loop)\n")
    print(f"{repeats} rounds, rotating order, medians.\n")
    names = [name for name in VARIANTS if name != "hooks only"]
    print("| tokens | " + " | ".join(f"{name} µs/token" for name in names) + " |")
    print("|---:|" + "---:|" * len(names))
    for new in lengths:
        def feed(name: str, new: int = new) -> None:
            bans = bans_for(name, tok)
            bans.start(1, 0)
            for token in longest[:new]:
                bans.observe([token], None, final=False)
            assert not bans.rewinds
        measured = rounds({name: (lambda n=name: feed(n)) for name in names
                           if name != "whole decode" or new <= 2000}, repeats)
        cells = [f"{statistics.median(r[name] for r in measured) / new * 1e6:.1f}" if name in measured[0] else "-"
                 for name in names]
        print(f"| {new} | " + " | ".join(cells) + " |", flush=True)
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--full-8000", action="store_true", help="the whole-decode reference at 8,000 tokens too")
    parser.add_argument("--only", choices=["1", "2", "3"], help="one table")
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = 3 if args.quick else 5
    tok = tokenizer(4000)
    print(f"torch {torch.__version__}, one thread, thread_time\n")
    if args.only in (None, "1"):
        per_token(tok, repeats, (200, 2000, 8000), 8000 if args.full_8000 else 2000)
    if args.only in (None, "2"):
        llama_ratio(tok, repeats, 2000)
    if args.only in (None, "3"):
        check_alone(tok, repeats, (200, 2000, 8000))


if __name__ == "__main__":
    main()
