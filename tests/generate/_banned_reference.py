"""A plain reference for banned strings: one row at a time, the whole sequence recomputed at every step.

Written from the rule, not from hfbridge's code: after each token, decode the row's generated tokens;
find the leftmost decided match (a banned string: case-insensitive substring, decided once complete;
a pattern: `re.match` at each character, decided when it ends before the end of the text or the text
is final); roll back to the token in which it begins (the first token whose prefix decodes past that
character), forbid that token at that position, forget what was forbidden after it, and go on.
"""

from __future__ import annotations

import re

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from hfbridge import sample_step

PIECES = ["a", "b", "c", "d", "e", " ", "ab", "ba", "cd", "dc", "abc", "bad", "cab", " a", "a ", "e ", "de", "ed",
          "bb", "aa", "cc", " ab", "b a", "dd", "ee", "eb", "be", "ca", "ac", "x", ".", "A", "B", "Ab", "bA", "D",
          " b", "b ", "c ", " c", "d ", " d", "E", "cE", "Ec", "db", "bd", "ad"]


def pieces_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """`<eos>`=0, `<pad>`=1, then `vocab - 2` text pieces (some of several characters), decoded without spaces."""
    vocabulary = {token: index for index, token in enumerate(["<eos>", "<pad>"] + PIECES[: vocab - 2])}
    assert len(vocabulary) == vocab
    backend = Tokenizer(models.BPE(vocab=vocabulary, merges=[]))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")


def leftmost_decided(text: str, strings: list[str], patterns: list[str], final: bool) -> int | None:
    starts = [text.lower().find(banned.lower()) for banned in strings]
    found = [start for start in starts if start >= 0]
    for pattern in patterns:
        compiled = re.compile(pattern)
        for start in range(len(text)):
            match = compiled.match(text, start)
            if match and match.end() > start and (match.end() < len(text) or final):
                found.append(start)
                break
    return min(found) if found else None


def reference_row(model, prompt: list[int], tokenizer, *, strings=(), patterns=(), max_new_tokens: int,
                  eos_token_id: int | None = None, generator=None, **options) -> tuple[list[int], int]:
    """The row's tokens (prompt included) and how many rollbacks it made. `model(ids) -> [1, T, V]`."""
    sequence, forbidden, rollbacks = list(prompt), {}, 0
    length = len(prompt)
    while True:
        ids = torch.tensor([sequence])
        logits = model(ids)[:, -1].float().clone()  # [1, V]
        for token in forbidden.get(len(sequence) - length, ()):
            logits[0, token] = float("-inf")
        token = int(sample_step(logits, ids, generator=generator, eos_token_id=eos_token_id, **options)[0])
        sequence.append(token)
        generated = sequence[length:]
        done = len(generated) == max_new_tokens or token == eos_token_id
        start = leftmost_decided(tokenizer.decode(generated), list(strings), list(patterns), final=done)
        if start is None:
            if done:
                return sequence, rollbacks
            continue
        keep = next(k for k in range(len(generated)) if len(tokenizer.decode(generated[: k + 1])) > start)
        forbidden = {k: tokens for k, tokens in forbidden.items() if k <= keep}
        forbidden.setdefault(keep, set()).add(generated[keep])
        del sequence[length + keep:]
        rollbacks += 1
