"""Padded vocabularies without `vocab_size=`: a tokenizer's size drops the padding columns of a step."""

import pytest
import torch
from tokenizers import Tokenizer, models

from hfbridge import Sampler, explain_step, sample_step
from hfbridge._step.plan.padded_vocab import check_drawn_ids, tokenizer_size

from _tiny_models import char_tokenizer

TOKENS = 45  # char_tokenizer's size
COLUMNS = 64  # the model's padded output


def padded_logits(seed: int = 0) -> torch.Tensor:
    """[2, 3, 64] logits whose padding columns (45-63) hold the best scores, as an untrained head's may."""
    logits = torch.randn(2, 3, COLUMNS, generator=torch.Generator().manual_seed(seed))
    logits[..., TOKENS:] += 10.0
    return logits


def test_tokenizer_size_of_each_kind():
    tok = char_tokenizer()
    assert tokenizer_size(tok) == len(tok) == TOKENS
    assert tokenizer_size(Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))) == 2

    class Tiktoken:  # tiktoken's Encoding: n_vocab, no len
        n_vocab = 50257

        def decode(self, ids):
            return ""

    assert tokenizer_size(Tiktoken()) == 50257
    assert tokenizer_size(object()) is None and tokenizer_size(None) is None


def test_added_token_above_len_counts():
    tok = char_tokenizer()

    class Holey:  # an added token whose id lies above len(): HF tokenizers with holes in their ids
        added_tokens_decoder = {**tok.added_tokens_decoder, 60: "<extra>"}

        def __len__(self):
            return TOKENS

    assert tokenizer_size(Holey()) == 61


def test_sample_step_with_tokenizer_never_draws_padding():
    logits, ids = padded_logits(), torch.tensor([[2, 3], [4, 5]])
    greedy = sample_step(logits, ids, tokenizer=char_tokenizer())
    assert torch.equal(greedy, logits[:, -1, :TOKENS].argmax(-1))  # by hand: the argmax of the real columns
    assert torch.equal(greedy, sample_step(logits, ids, vocab_size=TOKENS))
    sampled = sample_step(logits, ids, tokenizer=char_tokenizer(), do_sample=True,
                          generator=torch.Generator().manual_seed(1))
    expected = sample_step(logits, ids, vocab_size=TOKENS, do_sample=True, generator=torch.Generator().manual_seed(1))
    assert torch.equal(sampled, expected) and int(sampled.max()) < TOKENS


def test_vocab_size_keeps_the_padding_when_asked():
    logits = padded_logits()
    kept = sample_step(logits, tokenizer=char_tokenizer(), vocab_size=COLUMNS)
    assert torch.equal(kept, logits[:, -1].argmax(-1)) and int(kept.min()) >= TOKENS


def test_tokenizer_larger_than_logits_changes_nothing():
    logits = torch.randn(1, 4, 30)  # fewer columns than the tokenizer's 45 ids: no padding, no error
    assert torch.equal(sample_step(logits, tokenizer=char_tokenizer()), logits[:, -1].argmax(-1))


def test_explain_step_shows_no_padding():
    logits, ids = padded_logits(), torch.tensor([[2, 3], [4, 5]])
    trace = explain_step(logits, ids, tokenizer=char_tokenizer(), top=5)
    assert trace.stages[0].possible == TOKENS
    assert trace.stages[0].scores.shape == (TOKENS,) and max(trace.stages[0].top_ids) < TOKENS
    assert trace.token == int(logits[0, -1, :TOKENS].argmax())
    assert "''" not in str(trace)


def test_prompt_id_past_the_tokenizer_names_vocab_size():
    sampler = Sampler(tokenizer=char_tokenizer())
    with pytest.raises(ValueError, match=r"token id 50, outside the vocabulary of 45 tokens .*the tokenizer's size, "
                                         r"45: pass vocab_size= to keep more columns"):
        sampler(padded_logits(), torch.tensor([[2, 50], [4, 5]]))


def test_fast_path_drops_the_padding_too():
    logits = padded_logits()
    tokens = sample_step(logits, tokenizer=char_tokenizer(), do_sample=True, fast=True,
                         generator=torch.Generator().manual_seed(0))
    assert int(tokens.max()) < TOKENS


def test_check_drawn_ids():
    check_drawn_ids([1, 44], columns=COLUMNS, tokenizer=char_tokenizer(), caller="logprobs")  # in range
    check_drawn_ids([60], columns=COLUMNS, tokenizer=None, caller="logprobs")  # no tokenizer: nothing known
    with pytest.raises(ValueError, match=r"^logprobs: the generation drew token id 60, but the tokenizer knows 45 "
                                         r"tokens \(ids 0-44\) while the scores have 64 columns: .* vocab_size=45"):
        check_drawn_ids([3, 60], columns=COLUMNS, tokenizer=char_tokenizer(), caller="logprobs")
