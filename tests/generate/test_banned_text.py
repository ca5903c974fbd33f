"""The text side of banned strings: which matches are decided, where text is held back, bytes split over tokens."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hfbridge import BannedStrings, generate
from hfbridge._generate.banned_text import Verdict, check_text, compile_bans, strings_screen

from _tiny_models import TinyCore, TinyRecompute

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")


def test_banned_strings_are_case_insensitive_substrings_decided_when_complete():
    bans = compile_bans(["Shiver"], None)
    assert check_text(bans, "a SHIVERING cat", 0).match == 2  # no word boundaries, any case
    assert check_text(bans, "a shiv", 0) == Verdict(None, None, 2)  # could still complete: held from "shiv"
    assert check_text(bans, "a shiv", 0, final=True) == Verdict(None, None, 6)  # the text ended: nothing held
    assert check_text(bans, "a ship", 0) == Verdict(None, None, 6)


def test_patterns_are_decided_once_the_text_goes_past_the_match_or_ends():
    bans = compile_bans(None, [r"\bdelve\b", r"a+b?"])
    assert check_text(bans, "we delve", 0) == Verdict(None, None, 3)  # "delves" would not match
    assert check_text(bans, "we delves", 0) == Verdict(None, None, 9)
    assert check_text(bans, "we delve in", 0).match == 3
    assert check_text(bans, "we delve", 0, final=True).match == 3
    assert check_text(bans, "xaa", 0) == Verdict(None, None, 1)  # "aab" would be longer: undecided
    found = check_text(bans, "xaac", 0)
    assert found.match == 1 and found.pattern is not None and found.pattern.source == "a+b?"


def test_the_leftmost_decided_match_wins_and_zero_width_matches_are_ignored():
    bans = compile_bans(["cd", "b"], [r"(?=a)"])
    found = check_text(bans, "zacdb", 0)
    assert found.match == 2 and found.pattern is not None and found.pattern.source == "cd"
    assert check_text(compile_bans(None, [r"\b"]), "ab cd", 0) == Verdict(None, None, 5)


def test_search_starts_at_pos_but_sees_the_text_before_it():
    bans = compile_bans(None, [r"\bab"])
    assert check_text(bans, "xab ", 1).match is None  # "xab": no boundary before "a", although the search starts there
    assert check_text(bans, " ab ", 1).match == 1


def test_what_each_ban_may_read_before_its_match():
    """The check reads the text from `pos - context` on (banned_decode.py's window): 0 for a string, 1 for most
    patterns (\\b, ^), the whole text for a lookbehind, reverse search, Unicode word rules or graphemes."""
    strings = compile_bans(["a b"], None)
    patterns = compile_bans(None, [r"\bdelve\b", r"^x", r"(?m)^x", r"(?<=a)b", r"(?<!a)b", r"(?ir)ab", r"(?w)\bab",
                                   r"\Xa", r"(?P<name>a)b"])
    assert [ban.context for ban in strings + patterns] == [0, 1, 1, 1, None, None, None, None, None, 1]
    # a search that starts after the text's start sees the one character before it, and ^ holds only at the start
    text = "xa delve"
    for ban in patterns:
        if ban.context == 1:
            for pos in range(len(text)):
                whole = check_text((ban,), text, pos)
                cut = check_text((ban,), text[pos - 1:] if pos else text, 1 if pos else 0)
                assert (cut.match, cut.hold) == (
                    None if whole.match is None else whole.match - max(pos - 1, 0), whole.hold - max(pos - 1, 0))


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="abcAB \ufffd", max_size=12), strings=st.lists(st.sampled_from(
    ["ab", "b a", "B", "abc", "ca", "a\ufffd", "cc c"]), min_size=1, max_size=3, unique=True),
    pos=st.integers(0, 12), final=st.booleans())
def test_the_strings_screen_finds_something_wherever_check_text_does(text, strings, pos, final):
    bans = compile_bans(strings, None)
    screen = strings_screen(bans)
    end = len(text) if final else len(text.rstrip("\ufffd"))
    found = screen.search(text, pos, end, partial=not final)
    verdict = check_text(bans, text, pos, final=final)
    if found is None:
        assert verdict == Verdict(None, None, end)
    assert strings_screen(compile_bans(strings, [r"x"])) is None  # any pattern: no screen


def test_an_incomplete_character_is_held_back():
    bans = compile_bans(["zz"], None)
    assert check_text(bans, "ab\ufffd", 0) == Verdict(None, None, 2)  # the next bytes may complete it
    assert check_text(bans, "ab\ufffd", 0, final=True) == Verdict(None, None, 3)


def _byte_tokenizer():
    """One token per byte (GPT-2's byte-level alphabet, no merges): characters span several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = dict(enumerate(_bytes_to_unicode()))
    assert set(byte_to_char.values()) == set(alphabet)
    backend = Tokenizer(models.BPE(vocab={byte_to_char[b]: b for b in range(256)}, merges=[]))
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def _bytes_to_unicode():
    """GPT-2's map of bytes to printable characters (openai/gpt-2 encoder.py)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def test_characters_split_over_byte_tokens():
    tok = _byte_tokenizer()
    core = TinyCore(vocab=256, seed=2)
    prompt = torch.tensor([[72, 105]])
    plain = generate(TinyRecompute(core), prompt, max_new_tokens=12)
    assert any(byte >= 128 for byte in plain[0, 2:].tolist())  # the model makes non-ASCII bytes
    bans = BannedStrings(tok, regex=[r"[^\x00-\x7f]"], max_rewinds=256)  # any non-ASCII character, U+FFFD too
    received = []

    class Streamer:
        def put(self, value):
            received.append(value.tolist())

        def end(self):
            pass

    out = generate(TinyRecompute(core), prompt, max_new_tokens=12, banned_strings=bans, streamer=Streamer())
    assert bans.rewinds
    assert all(byte < 128 for byte in out[0, 2:].tolist())
    assert received == [prompt.tolist()] + out[:, 2:].T.tolist()
