"""A token's own bytes: `logprobs`' `bytes` and DRY's string breakers on vocabularies where a character spans tokens."""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hfbridge import logprobs, sample_step
from hfbridge.processors import DRYLogitsProcessor
from hfbridge.processors._dry_breakers import compile_breakers


def byte_level():
    """GPT-2's byte-level alphabet, one token per byte (no merges): "é" is two tokens, C3 and A9."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters = [chr(b) for b in printable] + [chr(256 + n) for n in range(256 - len(printable))]
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(characters))}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def byte_fallback():
    """SentencePiece-style byte fallback: `<0xC3>`, `<0xA9>` tokens."""
    vocab = {"<unk>": 0, "a": 1, "b": 2, "▁": 3, "<0xC3>": 4, "<0xA9>": 5, ":": 6}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


@pytest.mark.parametrize("make", [byte_level, byte_fallback])
def test_logprobs_bytes_are_the_tokens_own_bytes(make):
    tokenizer = make()
    ids = tokenizer.encode("aé", add_special_tokens=False)
    assert len(ids) == 3
    vocab = len(tokenizer)
    scores = tuple(torch.zeros(1, vocab) for _ in ids)
    out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[0, *ids]]), scores=scores)
    content = logprobs(out, tokenizer)[0]["content"]
    assert [item["bytes"] for item in content] == [[0x61], [0xC3], [0xA9]]  # "a", then é's two bytes
    assert bytes(b for item in content for b in item["bytes"]).decode("utf-8") == "aé"


@pytest.mark.parametrize("make", [byte_level, byte_fallback])
def test_dry_string_breaker_spanning_byte_tokens_is_found(make):
    tokenizer = make()
    first, second = tokenizer.encode("é", add_special_tokens=False)
    breakers = compile_breakers(["é"], tokenizer)
    assert breakers.singles == set() and breakers.tails == {(second,): {first}}


def test_dry_breaker_spanning_byte_tokens_stops_the_match():
    tokenizer = byte_level()
    a, b, z = tokenizer.encode("abz", add_special_tokens=False)
    c3, a9 = tokenizer.encode("é", add_special_tokens=False)
    ids = torch.tensor([[c3, a9, a, b, z, c3, a9, a]])  # "é a" again: "b" would repeat "é a b"
    scores = torch.zeros(1, len(tokenizer))
    penalised = DRYLogitsProcessor(1.0, allowed_length=2, sequence_breakers=[])(ids, scores.clone())
    expected = scores.clone()
    expected[0, b] = -1.0 * 1.75 ** (3 - 2)  # a match of 3 tokens, allowed 2: multiplier * base^(3 - 2)
    assert torch.equal(penalised, expected)
    broken = DRYLogitsProcessor(1.0, allowed_length=2, sequence_breakers=["é"], tokenizer=tokenizer)
    assert torch.equal(broken(ids, scores.clone()), scores)  # the match stops at "é": 1 token, under 2


def test_dry_breaker_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(ValueError) as error:
        sample_step(torch.zeros(1, 24), torch.tensor([[1, 2]]), dry_multiplier=1.0, dry_sequence_breakers=[[3], [1000]])
    assert str(error.value) == ("`dry_sequence_breakers` holds token id 1000, outside the vocabulary of 24 tokens "
                                "(ids must be in [0, 24)).")
