"""A third-party stateful processor end to end: xgrammar's HF `LogitsProcessor` constrains a custom
(non-HF) model to a grammar and to a JSON schema, with a tokenizer built locally (`tokenizers`).

xgrammar's processor keeps one grammar matcher per row and accepts the previous token at every
call: it relies on being called exactly once per new token, on every row (finished ones too), with
the full vocabulary of its `TokenizerInfo` — what HF's loop does and `generate` must do too.
"""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch

xgr = pytest.importorskip("xgrammar", reason="xgrammar is not installed (pip install -e '.[grammar]' in a clone)")
from xgrammar.contrib.hf import LogitsProcessor as GrammarProcessor  # noqa: E402

from hfbridge import ReturnsCache, generate  # noqa: E402

from _tiny_models import TinyCached, TinyCore, TinyRecompute, char_tokenizer, recompute_callable, tiny_gpt2  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_hf")

PADDED_VOCAB = 48  # the model's output columns; the tokenizer has 45 tokens

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "blue"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["color", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


@pytest.fixture(scope="module")
def compiler(tokenizer):
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=PADDED_VOCAB)
    return xgr.GrammarCompiler(info)


def _texts(tokenizer, sequences, prompt_length):
    return [tokenizer.decode(row[prompt_length:], skip_special_tokens=True) for row in sequences]


def test_small_grammar_on_a_custom_model(tokenizer, compiler):
    grammar = compiler.compile_grammar('root ::= "{\\"n\\":" [0-9] [0-9]? "}"')
    model = TinyRecompute(TinyCore(vocab=PADDED_VOCAB, seed=1))
    prompt = torch.tensor([tokenizer("a").input_ids, tokenizer("b").input_ids])
    free = generate(model, prompt, max_new_tokens=8)
    assert not all(re.fullmatch(r'\{"n":\d\d?\}', text) for text in _texts(tokenizer, free, 1))

    out = generate(model, prompt, max_new_tokens=12, processors=[GrammarProcessor(grammar)],
                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    texts = _texts(tokenizer, out, 1)
    assert all(re.fullmatch(r'\{"n":\d\d?\}', text) for text in texts), texts
    # each row ends with eos once the grammar is complete; a row that finished first is padded
    assert (out == tokenizer.eos_token_id).sum(dim=-1).tolist() == [1, 1]


def test_json_schema_sampling_with_a_kv_cache_model(tokenizer, compiler):
    grammar = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    model = ReturnsCache(TinyCached(TinyCore(vocab=PADDED_VOCAB, seed=2)))
    prompt = torch.tensor([tokenizer("go").input_ids] * 3)
    mask = torch.ones_like(prompt)
    torch.manual_seed(0)
    out = generate(model, prompt, attention_mask=mask, max_new_tokens=40, do_sample=True, temperature=1.5,
                   processors=[GrammarProcessor(grammar)], eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    for text in _texts(tokenizer, out, 2):
        value = json.loads(text)
        assert set(value) == {"color", "n"} and value["color"] in ("red", "blue") and 0 <= value["n"] <= 99


def test_trimmed_vocabulary_still_works(tokenizer, compiler):
    """With `vocab_size=45` the processor sees 45 columns; xgrammar's 48-wide bitmask still applies."""
    grammar = compiler.compile_grammar('root ::= "{" [a-c] ("," [a-c])* "}"')
    model = TinyRecompute(TinyCore(vocab=PADDED_VOCAB, seed=3))
    out = generate(model, torch.tensor([tokenizer("x").input_ids]), max_new_tokens=20, vocab_size=len(tokenizer),
                   processors=[GrammarProcessor(grammar)], eos_token_id=tokenizer.eos_token_id)
    text = _texts(tokenizer, out, 1)[0]
    assert re.fullmatch(r"\{[a-c](,[a-c])*(\}|,)?", text), text  # complete, or cut by max_new_tokens


def test_same_tokens_as_hf_generate_with_the_grammar(tokenizer, compiler):
    grammar = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    hf = tiny_gpt2()
    prompt = torch.tensor([tokenizer("go").input_ids])
    options = dict(max_new_tokens=30, do_sample=True, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = hf.generate(prompt, logits_processor=[GrammarProcessor(grammar)], use_cache=False, **options)
    torch.manual_seed(5)
    ours = generate(recompute_callable(hf), prompt, processors=[GrammarProcessor(grammar)], **options)
    assert torch.equal(ours, theirs)
    json.loads(_texts(tokenizer, ours, 2)[0])
