"""Train the demo model from scratch: ``python -m hfbridge.demo.train``.

The corpus is all written for hfbridge, nothing is downloaded: ``corpus.txt`` next to this file
(a short field guide to decoding, some Python, a few little stories and the project's design
notes, about 19 KB) and a few thousand short stories about one seaside town drawn from the
seeded story grammar in ``_stories.py`` (about 0.7 MB of plain, well-formed sentences). With the
default settings the run is seeded and single-threaded, so it writes the same ``tokenizer.json``
and ``model.pt`` every time; it takes about 20 minutes on one CPU core.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from hfbridge.demo._assets import ASSET_DIR, EOS_TOKEN, PAD_TOKEN
from hfbridge.demo._model import DemoConfig, DemoLM
from hfbridge.demo._stories import stories

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["DEFAULT_CONFIG", "STORY_COUNT", "build_tokenizer", "corpus_documents", "main", "train"]

STORY_COUNT = 4000
"""Stories drawn from the story grammar (duplicates dropped) for the corpus."""
HANDWRITTEN_REPEATS = 3
"""How often the hand-written sections appear in the training stream, so the small model still
knows them (Q/A, code) beside a hundred times more story text."""
DEFAULT_CONFIG = DemoConfig(vocab_size=2048, n_layer=4, n_head=4, n_embd=192, dropout=0.1)
"""Sizes of the shipped model (``vocab_size`` is what the tokenizer is trained to)."""


def corpus_documents(path: Path | None = None, story_count: int = STORY_COUNT) -> list[str]:
    """The training documents: the hand-written corpus split at its ``# `` headings, then the stories.

    Args:
        path: The hand-written corpus. Default: ``corpus.txt`` of the package.
        story_count: Stories to draw from the story grammar (seed 0); repeats are dropped.
            Default: ``STORY_COUNT``.

    >>> docs = corpus_documents()
    >>> docs[0].startswith("# The hfbridge field guide")
    True
    >>> len(docs) == len(set(docs))
    True
    """
    return _handwritten(path) + list(dict.fromkeys(stories(story_count)))


def _handwritten(path: Path | None = None) -> list[str]:
    text = (path or ASSET_DIR / "corpus.txt").read_text(encoding="utf-8")
    docs: list[str] = []
    current: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("# ") and current:
            docs.append("".join(current).strip() + "\n")
            current = []
        current.append(line)
    docs.append("".join(current).strip() + "\n")
    return docs


def build_tokenizer(documents: list[str], vocab_size: int = DEFAULT_CONFIG.vocab_size) -> Tokenizer:
    """Train a byte-level BPE ``tokenizers.Tokenizer`` on ``documents``.

    Byte-level means any text can be encoded (no unknown token), and the GPT-2 style
    decoder turns ids back into exactly the original text, which streamers rely on.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer)
    return tokenizer


def _token_stream(tokenizer: Tokenizer, documents: list[str]) -> torch.Tensor:
    """All documents as one stream of ids ``[N]``, each followed by the eos token."""
    eos = tokenizer.token_to_id(EOS_TOKEN)
    if eos is None:
        raise ValueError(f"the tokenizer has no {EOS_TOKEN!r} token")
    ids: list[int] = []
    for doc in documents:
        ids.extend(tokenizer.encode(doc).ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def train(
    *,
    steps: int = 1600,
    batch_size: int = 12,
    context: int = 128,
    lr: float = 3e-3,
    seed: int = 0,
    out_dir: Path = ASSET_DIR,
    config: DemoConfig | None = None,
    log_every: int = 100,
    story_count: int = STORY_COUNT,
) -> DemoLM:
    """Build the tokenizer, train a :class:`DemoLM`, save both into ``out_dir``.

    Args:
        steps: Optimizer steps. Default: ``1600``.
        batch_size: Windows per step. Default: ``12``.
        context: Tokens per window; at most ``config.block_size``. Default: ``128``.
        lr: Peak AdamW learning rate (linear warm-up, cosine decay to a tenth). Default: ``3e-3``.
        seed: Seed for initialisation and batch sampling. Default: ``0``.
        out_dir: Where ``tokenizer.json`` and ``model.pt`` are written. Default: the package.
        config: Model sizes; ``vocab_size`` is the tokenizer's target size and is then set to the
            size it reached. Default: ``DEFAULT_CONFIG``.
        story_count: Stories in the corpus. Default: ``STORY_COUNT``.
        log_every: Print the loss every this many steps. Default: ``100``.

    Returns:
        The trained model, in eval mode.
    """
    torch.manual_seed(seed)
    documents = corpus_documents(story_count=story_count)
    # Dropout keeps the small model from memorising the corpus outright, so its distributions
    # stay spread enough for the sampling settings to make a visible difference.
    config = config or DEFAULT_CONFIG
    tokenizer = build_tokenizer(documents, vocab_size=config.vocab_size)
    handwritten = _handwritten()
    data = _token_stream(tokenizer, handwritten * (HANDWRITTEN_REPEATS - 1) + documents)
    config = DemoConfig(**{**config.to_dict(), "vocab_size": tokenizer.get_vocab_size()})
    if context > config.block_size:
        raise ValueError(f"context: got {context}, expected at most block_size={config.block_size}")
    print(f"corpus: {len(documents)} documents, {sum(map(len, documents)):,} characters, "
          f"{data.numel():,} training tokens, vocab {config.vocab_size}")

    model = DemoLM(config)
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.99),
    )
    warmup = max(1, steps // 25)
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.arange(context + 1)
    start = time.perf_counter()
    model.train()
    for step in range(steps):
        cosine = 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))
        scale = (step + 1) / warmup if step < warmup else cosine
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        starts = torch.randint(0, data.numel() - context - 1, (batch_size, 1), generator=generator)
        window = data[starts + offsets]  # [B, context + 1]
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % log_every == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  {time.perf_counter() - start:6.0f}s", flush=True)
    model.eval()

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    # float16 halves the shipped file; loading upcasts back to float32.
    state = {k: v.to(torch.float16) for k, v in model.state_dict().items()}
    torch.save({"config": config.to_dict(), "state_dict": state, "seed": seed, "steps": steps}, out_dir / "model.pt")
    print(f"saved {out_dir / 'tokenizer.json'} and {out_dir / 'model.pt'} after {time.perf_counter() - start:.0f}s")
    return model


def main(argv: list[str] | None = None) -> None:
    """Command line entry point; see ``--help``."""
    parser = argparse.ArgumentParser(prog="python -m hfbridge.demo.train", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1600, help="optimizer steps (default: 1600)")
    parser.add_argument("--batch-size", type=int, default=12, help="windows per step (default: 12)")
    parser.add_argument("--context", type=int, default=128, help="tokens per training window (default: 128)")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default: 3e-3)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1, for repeatability)")
    parser.add_argument("--out-dir", type=Path, default=ASSET_DIR,
                        help="output folder (default: the hfbridge.demo package)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    train(steps=args.steps, batch_size=args.batch_size, context=args.context, lr=args.lr, seed=args.seed,
          out_dir=args.out_dir)


if __name__ == "__main__":
    main()
