"""Banned strings' incremental text (`banned_decode.WindowText`) against the whole decode, for every decoder kind.

The tokenizers are `_banned_tokenizers.py`'s (byte-level BPE with merges, SentencePiece-like Metaspace, Llama-like
byte fallback, WordPiece, transformers' clean-up of spaces, word-level, CTC), with multi-byte characters whole
and split over tokens, added and special tokens. The reference is the whole decode at every step (`FullText`,
what banned strings did before).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from _banned_tokenizers import CORPUS, KINDS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hfbridge import BannedStrings, generate
from hfbridge._generate.banned_decode import MARGIN_TOKENS, SPAN, FullText, WindowText, row_text

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

TOKENIZERS = {name: make() for name, make in KINDS.items()}
ENCODED = {name: [tok(text, add_special_tokens=False).input_ids for text in CORPUS] for name, tok in TOKENIZERS.items()}
REPLACEMENT = "\ufffd"


class Counting:
    """`decode` that records how many tokens each call decodes."""

    def __init__(self, tok):
        self.tok, self.sizes = tok, []

    def __call__(self, ids):
        self.sizes.append(len(ids))
        return self.tok.decode(ids)


def _check(text: WindowText, tok, ids: list[int], count: int) -> None:
    whole = tok.decode(ids[:count]) if count else ""
    assert text.full() == whole
    assert text.length == len(whole) and text.stable_end() == len(whole.rstrip(REPLACEMENT))
    for start in (0, len(whole) // 2, max(len(whole) - 3, 0), len(whole)):
        assert text.view(start) == whole[start:]


# op: ("token", id) appends one id; ("run", text, start, length) appends corpus tokens one at a time;
# ("cut", k) drops the last k ids (a rollback); ("pad", k) puts k padding ids after the real ones (a finished row)
def _ops(vocab: int):
    return st.lists(st.one_of(
        st.tuples(st.just("token"), st.integers(0, vocab - 1)),
        st.tuples(st.just("run"), st.integers(0, len(CORPUS) - 1), st.integers(0, 60), st.integers(1, 40)),
        st.tuples(st.just("cut"), st.integers(1, 30)),
        st.tuples(st.just("pad"), st.integers(1, 3)),
    ), min_size=1, max_size=30)


@pytest.mark.parametrize("kind", list(KINDS))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_window_text_equals_the_whole_decode_after_every_token_and_rollback(kind, data):
    tok = TOKENIZERS[kind]
    text, ids, count = WindowText(tok.decode), [], 0
    for op in data.draw(_ops(len(tok))):
        if op[0] == "pad":
            ids = ids[:count] + [tok.pad_token_id] * op[1]
            text.update(ids, count)
            _check(text, tok, ids, count)
            continue
        del ids[count:]
        if op[0] == "cut":
            count = max(count - op[1], 0)
            del ids[count:]
            text.update(ids, count)
            _check(text, tok, ids, count)
            continue
        new = [op[1]] if op[0] == "token" else ENCODED[kind][op[1]][op[2]:op[2] + op[3]]
        for token in new:
            ids.append(token)
            count += 1
            text.update(ids, count)
            _check(text, tok, ids, count)


@pytest.mark.parametrize("kind", ["byte_level", "metaspace", "llama_like"])
def test_each_step_decodes_a_short_window(kind):
    tok = TOKENIZERS[kind]
    ids = [token for _ in range(4) for encoded in ENCODED[kind] for token in encoded]  # hundreds of tokens
    decode = Counting(tok)
    text = WindowText(decode)
    for count in range(1, len(ids) + 1):
        text.update(ids, count)
    assert text.full() == tok.decode(ids) and len(ids) > 400
    # the window: a prefix of MARGIN_TOKENS (more where those hold few characters) and SPAN tokens after it (more
    # while the text ends inside a character); about one decode a step
    assert max(decode.sizes[100:]) <= 4 * MARGIN_TOKENS + 3 * SPAN < len(ids) / 4
    assert sum(decode.sizes) < (3 * MARGIN_TOKENS + SPAN) * len(ids) and len(decode.sizes) < 1.3 * len(ids)


def test_the_whole_decode_stays_for_other_decode_objects():
    class Mine:
        def decode(self, ids):
            return "".join(chr(97 + token % 26) for token in ids)[::-1]  # reversed: no window can be trusted

    assert isinstance(row_text(Mine())(), FullText)
    assert isinstance(row_text(TOKENIZERS["metaspace"])(), WindowText)
    assert isinstance(row_text(TOKENIZERS["metaspace"].backend_tokenizer)(), WindowText)
    text = WindowText(Mine().decode)  # the prefix check sees every step change the text before the seam
    ids = list(range(60))
    for count in range(1, 61):
        text.update(ids, count)
        assert text.full() == Mine().decode(ids[:count])


# ------------------------------------------------------------------------------------------
# generate: the same tokens and rollbacks as the whole decode
# ------------------------------------------------------------------------------------------

PATTERNS = [r"\b\w\w\b", r"(?<=a)b", r"[😀-🙏]", r"猫.", r"(?i)THE\s"]


def _bigram_model(kind: str, seed: int):
    """A model that mostly follows the corpus's bigrams (real words, CJK, emoji, bytes of split characters), with
    random noise: `model(ids) -> (rows, length, vocab)`."""
    vocab = len(TOKENIZERS[kind])
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed))  # [V, V]
    for encoded in ENCODED[kind]:
        for previous, token in itertools.pairwise(encoded):
            table[previous, token] += 6.0
    return lambda ids: table[ids]


@pytest.mark.parametrize("kind", ["byte_level", "metaspace", "llama_like", "cleaned_up"])
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), data=st.data())
def test_generate_gives_the_tokens_of_the_whole_decode(kind, seed, data):
    tok = TOKENIZERS[kind]
    rows, new = 3, 48
    model = _bigram_model(kind, seed)
    starts = [encoded[0] for encoded in ENCODED[kind]]
    prompts = torch.tensor([[starts[(seed + row) % len(starts)]] for row in range(rows)])  # [3, 1]
    options = dict(max_new_tokens=new, do_sample=True, top_k=8, eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id)
    plain = generate(model, prompts, generator=[torch.Generator().manual_seed(seed + row) for row in range(rows)],
                     **options)
    texts = [tok.decode(row) for row in plain[:, 1:].tolist()]
    # bans that the plain text holds (spaces, multi-byte characters and token boundaries inside them) and patterns
    strings = []
    for text in texts:
        if len(text) > 3:
            start = data.draw(st.integers(0, len(text) - 3))
            banned = text[start:start + data.draw(st.integers(1, 3))]
            if REPLACEMENT not in banned:
                strings.append(banned)
    patterns = data.draw(st.lists(st.sampled_from(PATTERNS), max_size=2, unique=True))
    if not strings and not patterns:
        patterns = [PATTERNS[0]]
    outcomes = []
    for text_kind in (None, FullText):
        bans = BannedStrings(tok, strings or None, regex=patterns or None, max_rewinds=8)
        if text_kind is not None:
            bans._text = lambda: FullText(tok.decode)  # the whole decode at every step: the old behaviour
        generators = [torch.Generator().manual_seed(seed + row) for row in range(rows)]
        try:
            out = generate(model, prompts, banned_strings=bans, generator=generators, **options)
            outcomes.append((out.tolist(), bans.rewinds))
        except ValueError as error:  # too many rollbacks to one position: the same error
            outcomes.append((str(error), bans.rewinds))
    assert outcomes[0] == outcomes[1]
