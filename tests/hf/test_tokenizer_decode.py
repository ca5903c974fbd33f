"""`backend_decode`: the `tokenizers` decode, only where it gives `tokenizer.decode(ids)`'s text."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from hfbridge._hf.tokenizer_decode import backend_decode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "generate"))
from _banned_tokenizers import KINDS

pytestmark = pytest.mark.usefixtures("quiet_hf")


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_same_text_as_decode_or_none(kind):
    tok = KINDS[kind]()
    decode = backend_decode(tok)
    assert (decode is None) == (kind == "cleaned_up")  # clean_up_tokenization_spaces: transformers' own step
    if decode is None:
        return
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(0, 40))]
        assert decode(ids) == tok.decode(ids)


def test_a_class_with_its_own_decode_keeps_it():
    class Timestamps(PreTrainedTokenizerFast):
        def _decode(self, token_ids, **kwargs):
            return "<0.00>" + super()._decode(token_ids, **kwargs)

    class Offsets(PreTrainedTokenizerFast):
        def decode(self, token_ids, **kwargs):
            return super().decode(token_ids, **kwargs).upper()

    raw = KINDS["metaspace"]().backend_tokenizer
    assert backend_decode(Timestamps(tokenizer_object=raw)) is None
    assert backend_decode(Offsets(tokenizer_object=raw)) is None
    assert backend_decode(raw) is None  # a `tokenizers.Tokenizer` itself: its own decode is used as it is
    assert backend_decode(PreTrainedTokenizerFast(tokenizer_object=raw)) is not None
