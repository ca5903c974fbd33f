"""`generate(banned_strings=, banned_regex=)`: rollbacks, against a plain one-row reference, in every model form.

The models are tests/_tiny_models.py's (one random attention layer in each model form, a tiny HF GPT-2),
the tokenizer a local one whose tokens are text pieces of one to three characters
(`_banned_reference.pieces_tokenizer`), so that bans begin inside tokens and span several.
"""

from __future__ import annotations

import re

import pytest
import torch
from _banned_reference import leftmost_decided, pieces_tokenizer, reference_row
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hfbridge import BannedStrings, Hooks, ModelAdapter, ReturnsCache, generate

from _tiny_models import TinyCached, TinyCore, TinyMasked, TinyRecompute, every_model_form

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

V = 32
TOK = pieces_tokenizer(V)
STRINGS = ["ab", "ba", "c d", "dd", "abc", "e a", "b", "Cab", "ee"]
PATTERNS = [r"\bab\b", r"c+d", r"(?i)DE", r"a.b", r"[ce]{2}"]


def _texts(sequences: torch.Tensor, prompt: int) -> list[str]:
    texts = []
    for row in sequences[:, prompt:].tolist():
        real = row[: row.index(0) + 1] if 0 in row else row  # up to <eos>, without the padding after it
        texts.append(TOK.decode(real))
    return texts


class Recording:
    """A streamer that records every `put` (a batch column per step) and `end`."""

    def __init__(self):
        self.columns, self.ended = [], False

    def put(self, value):
        self.columns.append(value.tolist())

    def end(self):
        self.ended = True


# ------------------------------------------------------------------------------------------
# the reference, every model form, never emitted (hypothesis)
# ------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 50), rows=st.integers(1, 3), prompt=st.lists(st.integers(2, V - 1), min_size=1, max_size=4),
       strings=st.lists(st.sampled_from(STRINGS), max_size=2, unique=True),
       patterns=st.lists(st.sampled_from(PATTERNS), max_size=2, unique=True),
       sample=st.booleans(), eos=st.booleans(), new=st.integers(1, 10))
def test_equal_to_the_one_row_reference_in_every_form(seed, rows, prompt, strings, patterns, sample, eos, new):
    if not (strings or patterns):
        strings = ["ab"]
    core = TinyCore(vocab=V, seed=seed)
    prompts = torch.tensor([prompt] * rows)
    if rows > 1:
        prompts[1:, 0] = (prompts[1:, 0] + torch.arange(1, rows)) % (V - 2) + 2  # rows that differ
    options = dict(do_sample=sample, top_k=8, temperature=1.5) if sample else dict(do_sample=False)
    eos_id = {"eos_token_id": 0, "pad_token_id": 1} if eos else {}
    expected = []
    for row in range(rows):
        generator = torch.Generator().manual_seed(100 + row)
        tokens, _ = reference_row(TinyRecompute(core), prompts[row].tolist(), TOK, strings=strings,
                                  patterns=patterns, max_new_tokens=new, generator=generator,
                                  eos_token_id=0 if eos else None, **options)
        expected.append(tokens)
    width = max(len(tokens) for tokens in expected)
    expected = torch.tensor([tokens + [1] * (width - len(tokens)) for tokens in expected])
    for name, adapter in every_model_form(core, rows, len(prompt) + new + 1).items():
        streamer = Recording() if rows == 1 else None
        generators = [torch.Generator().manual_seed(100 + row) for row in range(rows)]
        out = generate(adapter, prompts, max_new_tokens=new, tokenizer=TOK, banned_strings=strings or None,
                       banned_regex=patterns or None, banned_max_rewinds=V, generator=generators,
                       streamer=streamer, **eos_id, **options)
        assert torch.equal(out, expected), name
        for text in _texts(out, len(prompt)):
            assert leftmost_decided(text, strings, patterns, final=True) is None, (name, text)
        if streamer is not None:  # the prompt, then each column once no rollback can take it back
            assert streamer.columns == [prompts.tolist()] + out[:, len(prompt):].T.tolist() and streamer.ended


def test_rows_roll_back_independently_and_replay_their_own_tokens():
    core = TinyCore(vocab=V, seed=3)
    prompts = torch.tensor([[5, 9], [7, 3], [12, 4]])
    plain = generate(TinyRecompute(core), prompts, max_new_tokens=12)
    texts = _texts(plain, 2)
    # a string row 1 makes and the others do not: only row 1 rolls back
    start, banned = next((i, texts[1][i:i + 2]) for i in range(3, len(texts[1]) - 1)
                         if all(texts[1][i:i + 2].lower() not in other.lower() for other in texts[::2]))
    bans = BannedStrings(TOK, [banned])
    out = generate(TinyRecompute(core), prompts, max_new_tokens=12, banned_strings=bans)
    assert torch.equal(out[::2], plain[::2])  # the others: their own tokens, replayed
    assert banned.lower() not in _texts(out, 2)[1].lower()
    assert bans.rewinds and {rewind.row for rewind in bans.rewinds} == {1}
    first = bans.rewinds[0]
    assert first.position == 2 + next(k for k in range(12) if len(TOK.decode(plain[1, 2:3 + k])) > start)
    assert first.token == int(plain[1, first.position]) and first.match.lower() == banned.lower()


# ------------------------------------------------------------------------------------------
# no ban triggers: plain generation
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [dict(do_sample=False), dict(do_sample=True, top_p=0.9, temperature=0.8),
                                     dict(do_sample=True, top_k=5, fast=True)])
def test_equal_to_plain_generation_when_no_ban_triggers(options):
    core = TinyCore(vocab=V, seed=1)
    prompts = torch.tensor([[5, 9, 2], [0, 7, 3]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    torch.manual_seed(7)
    plain = generate(TinyMasked(core), prompts, attention_mask=mask, max_new_tokens=10, **options,
                     return_dict_in_generate=True, output_scores=True)
    torch.manual_seed(7)
    out = generate(TinyMasked(core), prompts, attention_mask=mask, max_new_tokens=10, tokenizer=TOK,
                   banned_strings=["zz"], banned_regex=[r"\d"], **options,
                   return_dict_in_generate=True, output_scores=True)
    assert torch.equal(out.sequences, plain.sequences)
    assert all(torch.equal(a, b) for a, b in zip(out.scores, plain.scores)) and len(out.scores) == 10


def test_scores_and_logits_of_rolled_back_steps_are_dropped():
    core = TinyCore(vocab=V, seed=3)
    prompt = torch.tensor([[5, 9]])
    plain = generate(TinyRecompute(core), prompt, max_new_tokens=8)
    banned = _texts(plain, 2)[0][2:4]
    bans = BannedStrings(TOK, [banned])
    out = generate(TinyRecompute(core), prompt, max_new_tokens=8, banned_strings=bans,
                   return_dict_in_generate=True, output_scores=True, output_logits=True)
    assert bans.rewinds
    assert len(out.scores) == len(out.logits) == out.sequences.shape[1] - 2 == 8
    for step, scores in enumerate(out.scores):  # greedy: each kept step's scores chose its token
        assert int(scores.argmax()) == int(out.sequences[0, 2 + step])


# ------------------------------------------------------------------------------------------
# stateful processors: rolled back with the tokens
# ------------------------------------------------------------------------------------------


class SeenPenalty:
    """Stateful: remembers, per row, the tokens it has seen (one per call), and lowers their scores.

    Follows `hfbridge.processors._stateful`'s protocol; a state that missed a rollback lowers tokens
    that are no longer in the sequence, so the tokens show it.
    """

    def __init__(self):
        self.reset()

    def reset(self):
        self.seen = None  # per row: the tokens seen, in order
        self.prompt = None

    def reorder(self, beam_idx):
        self.seen = [list(self.seen[i]) for i in beam_idx.tolist()]

    def rollback(self, lengths):
        # the next call receives `length` tokens: the state it had before the first such call
        self.seen = [seen[: max(length - 1 - self.prompt, 0)] for seen, length in zip(self.seen, lengths.tolist())]

    def __call__(self, input_ids, scores):
        if self.seen is None:
            self.seen, self.prompt = [[] for _ in range(input_ids.shape[0])], input_ids.shape[1]
        if input_ids.shape[1] > self.prompt:
            for seen, token in zip(self.seen, input_ids[:, -1].tolist()):
                seen.append(token)
        out = scores.clone()
        for row, seen in enumerate(self.seen):
            for token in seen:
                out[row, token] -= 1.0
        return out


class StatelessPenalty:
    """The same penalty, from `input_ids` alone (what `SeenPenalty` must be equal to)."""

    def __init__(self, prompt):
        self.prompt = prompt

    def __call__(self, input_ids, scores):
        out = scores.clone()
        for row, ids in enumerate(input_ids[:, self.prompt:].tolist()):
            for token in ids:
                out[row, token] -= 1.0
        return out


def test_stateful_processor_state_equals_a_run_that_never_saw_the_rewound_tokens():
    core = TinyCore(vocab=V, seed=5)
    prompts = torch.tensor([[5, 9], [7, 3]])
    expected = generate(TinyRecompute(core), prompts, max_new_tokens=12, tokenizer=TOK, banned_strings=["ab", "cd"],
                        banned_regex=[r"[ce]{2}"], processors=[StatelessPenalty(2)])
    for name, adapter in every_model_form(core, 2, 16).items():
        stateful = SeenPenalty()
        bans = BannedStrings(TOK, ["ab", "cd"], regex=[r"[ce]{2}"])
        out = generate(adapter, prompts, max_new_tokens=12, banned_strings=bans, processors=[stateful])
        assert bans.rewinds, name
        assert torch.equal(out, expected), name
        # every token it saw is in the final sequences (the last one it never sees)
        assert stateful.seen == out[:, 2:-1].tolist(), name


# ------------------------------------------------------------------------------------------
# streamers, an HF model passed directly, the standalone helper
# ------------------------------------------------------------------------------------------


def test_text_streamer_shows_exactly_the_final_text():
    from transformers import TextStreamer

    class Collect(TextStreamer):
        def __init__(self, tokenizer):
            super().__init__(tokenizer, skip_prompt=True)
            self.text = ""

        def on_finalized_text(self, text, stream_end=False):
            self.text += text

    core = TinyCore(vocab=V, seed=3)
    streamer = Collect(TOK)
    bans = BannedStrings(TOK, ["ab", "b a"], regex=[r"c+d"])
    out = generate(TinyRecompute(core), torch.tensor([[5, 9]]), max_new_tokens=15, banned_strings=bans,
                   streamer=streamer)
    assert bans.rewinds
    assert streamer.text == TOK.decode(out[0, 2:])


def test_an_hf_model_passed_directly_gives_the_recomputed_tokens():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                    bos_token_id=None, eos_token_id=None)).eval()
    prompts = torch.tensor([[5, 9, 2], [7, 3, 11]])
    options = dict(max_new_tokens=12, tokenizer=TOK, banned_strings=["ab", "cd", "b"], banned_regex=[r"[ce]{2}"])
    bans = BannedStrings(TOK, options.pop("banned_strings"), regex=options.pop("banned_regex"))
    out = generate(hf, prompts, banned_strings=bans, **options)
    assert bans.rewinds
    recomputed = generate(lambda ids: hf(ids, use_cache=False).logits, prompts, banned_strings=["ab", "cd", "b"],
                          banned_regex=[r"[ce]{2}"], **options)
    assert torch.equal(out, recomputed)


def test_the_standalone_helper_in_a_loop_of_ones_own():
    core = TinyCore(vocab=V, seed=3)
    model = TinyRecompute(core)
    prompts = torch.tensor([[5, 9], [7, 3]])
    expected = generate(model, prompts, max_new_tokens=10, tokenizer=TOK, banned_strings=["ab", "c d"])
    bans = BannedStrings(TOK, ["ab", "c d"])
    ids = prompts
    while ids.shape[1] < 12:
        scores = bans(ids, model(ids)[:, -1])
        ids = bans.advance(ids, scores.argmax(-1))
    assert bans.rewinds and torch.equal(ids, expected)


# ------------------------------------------------------------------------------------------
# the bound, refusals, bad values
# ------------------------------------------------------------------------------------------


def test_the_bound_on_rollbacks_to_one_position():
    # every token holds a letter; banning all five letters leaves only " ", "x" and "." in the vocabulary
    core = TinyCore(vocab=V, seed=3)
    with pytest.raises(ValueError, match=re.escape("after 2 rollbacks to that position (banned_max_rewinds=2); "
                                                   "raise banned_max_rewinds, or ban fewer strings.")) as error:
        generate(TinyRecompute(core), torch.tensor([[5, 9]]), max_new_tokens=6, tokenizer=TOK,
                 banned_regex=["[a-eA-E]"], banned_max_rewinds=2)
    assert re.match(r"row 0: the banned pattern '\[a-eA-E\]' matched '.*' again at token position 2", str(error.value))


@pytest.mark.parametrize(("options", "message"), [
    (dict(num_beams=2), "roll rows back in greedy search and sampling, not in beam search"),
    (dict(prompt_lookup_num_tokens=2), "not in assisted / prompt-lookup decoding"),
    (dict(guidance_scale=1.5), "not in classifier-free guidance (guidance_scale)"),
])
def test_refused_strategies_before_any_model_call(options, message):
    def model(ids):
        raise AssertionError("called")

    with pytest.raises(ValueError, match=re.escape(message)):
        generate(model, torch.tensor([[5, 9]]), max_new_tokens=3, tokenizer=TOK, banned_strings=["ab"], **options)


def test_bad_values_are_named():
    model, prompt = TinyRecompute(TinyCore(vocab=V)), torch.tensor([[5, 9]])
    cases = [
        (dict(banned_strings="ab", tokenizer=TOK), TypeError,
         "`banned_strings` must be a list of strings, got str 'ab' (wrap one string in a list)."),
        (dict(banned_strings=["ab", 3], tokenizer=TOK), TypeError, "`banned_strings[1]` must be a string, got int 3."),
        (dict(banned_strings=[""], tokenizer=TOK), ValueError, "`banned_strings[0]` is an empty string."),
        (dict(banned_regex=["a("], tokenizer=TOK), ValueError, "`banned_regex[0]` = 'a(' is not a valid regular"),
        (dict(banned_regex=["a*"], tokenizer=TOK), ValueError, "`banned_regex[0]` = 'a*' matches the empty string"),
        (dict(banned_strings=["ab"]), ValueError, "`banned_strings` / `banned_regex` need `tokenizer=`"),
        (dict(banned_strings=["ab"], banned_max_rewinds=0, tokenizer=TOK), ValueError,
         "`banned_max_rewinds` must be an int >= 1 (rollbacks allowed to one position), got int 0."),
        (dict(banned_strings=["ab"], banned_max_rewinds=True, tokenizer=TOK), ValueError,
         "`banned_max_rewinds` must be an int >= 1"),
        (dict(banned_max_rewinds=3, tokenizer=TOK), ValueError, "`banned_max_rewinds` bounds the rollbacks"),
        (dict(banned_strings=BannedStrings(TOK, ["ab"]), banned_regex=["b"]), ValueError,
         "`banned_strings` is a BannedStrings, which holds its own patterns"),
        (dict(banned_strings=[], banned_regex=[], tokenizer=TOK), ValueError,
         "BannedStrings needs at least one banned string or pattern"),
    ]
    for options, kind, message in cases:
        with pytest.raises(kind, match=re.escape(message)):
            generate(model, prompt, max_new_tokens=3, **options)


def test_adapters_that_cannot_crop_are_refused():
    class Mine(ModelAdapter):
        def forward(self, input_ids, state):
            return self.model(input_ids)

    core = TinyCore(vocab=V)
    with pytest.raises(TypeError, match=re.escape("but Mine does not say how (override crop(state, length)")):
        generate(Mine(TinyRecompute(core)), torch.tensor([[5, 9]]), max_new_tokens=3, tokenizer=TOK,
                 banned_strings=["ab"])

    def prepare_inputs(input_ids, *, attention_mask, kv=None):
        seen = 0 if kv is None else kv[0].shape[1]
        return {"idx": input_ids[:, seen:], "cache": kv, "attention_mask": attention_mask}

    hooks = Hooks(TinyCached(core), prepare_inputs, lambda outputs, state: {**state, "kv": outputs[1]})
    with pytest.raises(TypeError, match="kv"):
        generate(hooks, torch.tensor([[5, 9]]), max_new_tokens=3, tokenizer=TOK, banned_strings=["ab"])

    class Box:  # a cache hfbridge cannot crop by itself: said after the first call, before any rollback
        def __init__(self, pair):
            self.pair = pair

    calls = []

    def boxed(idx, cache, attention_mask):
        calls.append(idx.shape[1])
        logits, pair = TinyCached(core)(idx, None if cache is None else cache.pair, attention_mask)
        return logits, Box(pair)

    with pytest.raises(TypeError, match=re.escape("cannot drop positions from cache, a Box: hfbridge crops HF Cache")):
        generate(ReturnsCache(boxed), torch.tensor([[5, 9]]), max_new_tokens=3, tokenizer=TOK, banned_strings=["ab"])
    assert calls == [2]

    def crop(cache, length):
        return Box(tuple(part[:, :length] for part in cache.pair))

    expected = generate(TinyRecompute(core), torch.tensor([[5, 9]]), max_new_tokens=8, tokenizer=TOK,
                        banned_strings=["ab", "c"])
    out = generate(ReturnsCache(boxed, crop_cache=crop), torch.tensor([[5, 9]]), max_new_tokens=8, tokenizer=TOK,
                   banned_strings=["ab", "c"])
    assert torch.equal(out, expected)


def test_the_callers_tensors_and_lists_are_untouched():
    core = TinyCore(vocab=V, seed=3)
    prompts = torch.tensor([[5, 9], [7, 3]])
    strings, before = ["ab", "c d"], prompts.clone()
    generate(TinyRecompute(core), prompts, max_new_tokens=8, tokenizer=TOK, banned_strings=strings)
    assert torch.equal(prompts, before) and strings == ["ab", "c d"]


def test_the_docs_page_examples_run():
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "banned_strings.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "docs/banned_strings.md", "exec"), {})


STATEFUL = {  # name -> (class name in hfbridge.processors, keyword arguments)
    "mirostat": ("MirostatLogitsWarper", dict(tau=2.0, eta=0.5)),
    "mirostat_v1": ("MirostatV1LogitsWarper", dict(tau=2.0, eta=0.5, m=10)),
    "adaptive_p": ("AdaptivePLogitsWarper", dict(target=0.3, decay=0.5)),
    # start tag 9 ("ba") ends the prompts; the end tag "x", " " holds no banned string
    "thinking_budget": ("ThinkingBudgetLogitsProcessor", dict(budget=3, start_ids=[9], end_ids=[31, 7])),
}


@pytest.mark.parametrize("name", ["mirostat", "mirostat_v1", "adaptive_p", "thinking_budget"])
def test_stateful_sampler_state_equals_a_run_that_never_saw_the_rewound_tokens(name):
    import hfbridge.processors as samplers

    class_name, arguments = STATEFUL[name]
    if not hasattr(samplers, class_name):
        pytest.skip(f"no {class_name} in this checkout")

    def make():
        return getattr(samplers, class_name)(**arguments)

    sampler = make()
    if not callable(getattr(sampler, "rollback", None)):
        pytest.skip(f"{type(sampler).__name__} does not follow the stateful protocol in this checkout")
    core = TinyCore(vocab=V, seed=5)
    model = TinyRecompute(core)
    prompts = torch.tensor([[5, 9], [7, 9]])  # 9: the thinking budget's start tag, open at the end of the prompt
    bans = BannedStrings(TOK, ["ab", "cd", "b a"], regex=[r"[ce]{2}"])
    generators = [torch.Generator().manual_seed(row) for row in range(2)]
    out = generate(model, prompts, max_new_tokens=12, banned_strings=bans, processors=[sampler], do_sample=True,
                   generator=generators)
    assert bans.rewinds
    # a fresh one fed the final sequences (the same logits, the same forbidden tokens) is in the same state:
    # its next call returns what the used one returns
    fresh = make()

    def scores_at(length):
        scores = model(out[:, :length])[:, -1].float().clone()
        for row in range(2):
            for token in bans._rows[row].forbidden.get(length - 2, ()):
                scores[row, token] = float("-inf")
        return scores

    for length in range(2, out.shape[1]):
        fresh(out[:, :length], scores_at(length))
    last = model(out)[:, -1].float()
    assert torch.equal(sampler(out, last.clone()), fresh(out, last.clone()))


@pytest.mark.parametrize("case", ["num_return_sequences", "per_row_temperature", "fast", "eos_min_new_tokens",
                                  "penalties", "dry"])
def test_each_row_equals_that_row_alone_with_other_features(case):
    """With one generator per row, a row's tokens (rollbacks, replays) do not depend on the rest of its batch."""
    core = TinyCore(vocab=V, seed=4)
    prompts = torch.tensor([[5, 9], [7, 3]])
    options = {"num_return_sequences": dict(num_return_sequences=2, do_sample=True),
               "per_row_temperature": dict(do_sample=True, temperature=[0.5, 1.5]),
               "fast": dict(do_sample=True, fast=True, top_k=10),
               "eos_min_new_tokens": dict(do_sample=True, min_new_tokens=5, eos_token_id=0, pad_token_id=1),
               "penalties": dict(repetition_penalty=1.3, no_repeat_ngram_size=2),
               "dry": dict(do_sample=True, dry_multiplier=0.8, presence_penalty=0.5)}[case]
    expand = options.get("num_return_sequences", 1)
    rows = 2 * expand
    bans = BannedStrings(TOK, ["ab", "c d", "ee"], regex=[r"[ce]{2}"])
    out = generate(TinyRecompute(core), prompts, max_new_tokens=12, banned_strings=bans, tokenizer=TOK,
                   generator=[torch.Generator().manual_seed(row) for row in range(rows)], **options)
    assert bans.rewinds  # and the other rows replayed
    for row in range(rows):
        alone_options = {**options, "num_return_sequences": 1}
        if case == "per_row_temperature":
            alone_options["temperature"] = options["temperature"][row]
        alone = generate(TinyRecompute(core), prompts[row // expand][None], max_new_tokens=12, tokenizer=TOK,
                         banned_strings=["ab", "c d", "ee"], banned_regex=[r"[ce]{2}"],
                         generator=[torch.Generator().manual_seed(row)], **alone_options)
        assert torch.equal(alone[0], out[row, : alone.shape[1]]), row
        assert (out[row, alone.shape[1]:] == 1).all()  # padding after an early end
    for text in _texts(out, 2):
        assert leftmost_decided(text, ["ab", "c d", "ee"], [r"[ce]{2}"], final=True) is None


@pytest.mark.parametrize(("ban", "step", "named"), [
    (dict(banned_strings=["x"]), 3, "the banned string 'x'"),
    (dict(banned_regex=["x "]), 5, "the banned pattern 'x '"),
])
def test_a_ban_on_the_text_a_thinking_budget_forces_is_named(ban, step, named):
    """The budget forces its end tag ("x", " ") where a rollback forbade "x": the error names the ban and the budget."""
    with pytest.raises(ValueError) as caught:
        generate(TinyRecompute(TinyCore(vocab=V, seed=3)), torch.tensor([[5, 9]]), max_new_tokens=8, tokenizer=TOK,
                 thinking_budget=2, thinking_start=[9], thinking_end=[31, 7], **ban)
    assert str(caught.value) == (
        f"generate(): at step {step}: row 0 has nothing left to choose at position 4: {named} forbade token 31 ('x') "
        "there after a rollback, and the logits processors ['ThinkingBudgetLogitsProcessor'] removed every other "
        "token. `thinking_budget` ran out: ThinkingBudgetLogitsProcessor forces the end of thinking here "
        "(`thinking_end`, after `thinking_budget_message` if any), which the ban forbids. Drop the ban, or the "
        "option that forces the banned text.")
