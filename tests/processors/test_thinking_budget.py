"""ThinkingBudgetLogitsProcessor: the end sequence forced exactly at the budget (multi-token tags, a
message, budget 0, a start tag arriving twice, a natural end, waiting for a whole UTF-8 character),
a plain token-by-token reference of llama.cpp's state machine on random sequences, rows followed in
transformers' own `generate` (padding, sampling, beams), rollback / reorder, the options, errors."""

from __future__ import annotations

import random

import pytest
import torch
from _host_reads import HostReads
from transformers import LogitsProcessorList

from hfbridge import Recompute, accelerator_route, generate, sample_step
from hfbridge.processors import ThinkingBudgetLogitsProcessor

from _tiny_models import model_cache, recompute_callable

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

_model = model_cache()
V = 16
START, END, MESSAGE = [7], [8, 9], [10, 11]


def scripted(script):
    """A model that emits `script[i]` at generated position i (then token 1), whatever came before."""
    def model(input_ids, attention_mask):
        logits = torch.zeros(*input_ids.shape, V)
        step = input_ids.shape[1] - PROMPT_LEN
        want = script[step] if step < len(script) else 1
        logits[:, -1, want] = 5.0
        return logits
    return model


PROMPT_LEN = 3


def run(script, prompt, **options):
    out = generate(Recompute(scripted(script)), torch.tensor([prompt]), max_new_tokens=len(script), **options)
    return out[0, PROMPT_LEN:].tolist()


def test_end_forced_exactly_at_the_budget():
    # the prompt opens the span; the model would think forever (token 3)
    got = run([3] * 8, [1, 2, 7], thinking_budget=3, thinking_start=START, thinking_end=END)
    assert got == [3, 3, 3, 8, 9, 3, 3, 3]


def test_message_then_end_and_multi_token_start():
    got = run([3] * 9, [7, 5, 2], thinking_budget=2, thinking_start=[7, 5], thinking_end=END,
              thinking_budget_message=MESSAGE)
    assert got == [3, 3, 10, 11, 8, 9, 3, 3, 3]


def test_budget_zero_forces_at_once():
    assert run([3] * 4, [1, 2, 7], thinking_budget=0, thinking_start=START, thinking_end=END) == [8, 9, 3, 3]


def test_start_generated_then_again_rearms():
    script = [3, 7, 3, 3, 3, 3, 7, 3, 3, 3, 3]
    got = run(script, [1, 2, 3], thinking_budget=2, thinking_start=START, thinking_end=END)
    #          idle  start  2 spent   forced   done ...  start again  2 spent  forced
    assert got == [3, 7, 3, 3, 8, 9, 7, 3, 3, 8, 9]


def test_natural_end_and_partial_end_tag_count():
    # the model closes the span itself: nothing is forced (the tag's first token spends one of the 4)
    assert run([3, 3, 8, 9, 3, 3, 3], [1, 2, 7], thinking_budget=4, thinking_start=START,
               thinking_end=END) == [3, 3, 8, 9, 3, 3, 3]
    # with 3, that first token spends the last one: the whole end tag is forced after it
    assert run([3, 3, 8, 9, 3, 3, 3], [1, 2, 7], thinking_budget=3, thinking_start=START,
               thinking_end=END) == [3, 3, 8, 8, 9, 3, 3]
    # a partial end tag (8 then not 9) spends the budget like any token
    assert run([8, 3, 3, 3, 3], [1, 2, 7], thinking_budget=2, thinking_start=START,
               thinking_end=END) == [8, 3, 8, 9, 3]


def test_prompt_with_a_closed_span_is_idle():
    assert run([3] * 5, [7, 8, 9], thinking_budget=1, thinking_start=START, thinking_end=END) == [3] * 5


# ---- a plain reference: llama.cpp's common_reasoning_budget_accept, one row, one token at a time ----

class Matcher:
    def __init__(self, tag):
        self.tag, self.pos = tag, 0

    def advance(self, token):
        if token == self.tag[self.pos]:
            self.pos += 1
            if self.pos >= len(self.tag):
                self.pos = 0
                return True
        else:
            self.pos = 1 if token == self.tag[0] else 0
        return False


class Reference:
    def __init__(self, budget, start, end, forced, prompt, incomplete=()):
        self.budget, self.forced, self.incomplete = budget, forced, set(incomplete)
        self.start, self.end = Matcher(start), Matcher(end)
        self.state, self.remaining, self.at = "idle", budget, 0
        last_start = max((i + len(start) for i in range(len(prompt)) if prompt[i:i + len(start)] == start), default=0)
        last_end = max((i + len(end) for i in range(len(prompt)) if prompt[i:i + len(end)] == end), default=0)
        if last_start > last_end:
            self.state = "counting" if budget > 0 else "forcing"

    def accept(self, token):
        if self.state in ("idle", "done"):
            if self.start.advance(token):
                self.state, self.remaining, self.at, self.end.pos = "counting", self.budget, 0, 0
                if self.remaining <= 0:
                    self.state = "forcing"
        elif self.state in ("counting", "waiting"):
            if self.end.advance(token):
                self.state = "done"
                return
            whole = token not in self.incomplete
            if self.state == "waiting":
                if whole:
                    self.state, self.at, self.end.pos = "forcing", 0, 0
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    self.state, self.end.pos = ("forcing", 0) if whole else ("waiting", 0)
                    self.at = 0
        elif self.state == "forcing":
            self.at += 1
            if self.at >= len(self.forced):
                self.state = "done"

    def allowed(self):
        return [self.forced[self.at]] if self.state == "forcing" else None


@pytest.mark.parametrize("seed", range(12))
def test_equals_the_reference_on_random_sequences(seed):
    rng = random.Random(seed)
    rows, steps = 3, 40
    budgets = [rng.randrange(0, 5) for _ in range(rows)]
    start = rng.choice([[7], [7, 5]])
    end = rng.choice([[8], [8, 9], [8, 8, 9]])
    message = rng.choice([[], [10], [10, 11]])
    incomplete = rng.sample(range(V), 3)
    prompts = [[rng.choice([1, 7, 8, 9, 5]) for _ in range(4)] for _ in range(rows)]
    budget = ThinkingBudgetLogitsProcessor(budgets, start, end, message)
    budget._on(V, torch.device("cpu"))[3][incomplete] = False  # the UTF-8 table a tokenizer would give
    refs = [Reference(b, start, end, message + end, p, incomplete) for b, p in zip(budgets, prompts)]
    ids = torch.tensor(prompts)
    for _ in range(steps):
        out = budget(ids, torch.zeros(rows, V))
        chosen = []
        for row, ref in enumerate(refs):
            allowed = ref.allowed()
            finite = out[row].isfinite().nonzero().flatten().tolist()
            assert finite == (allowed if allowed is not None else list(range(V)))
            # mostly tag-ish tokens, to walk every state
            token = allowed[0] if allowed is not None and rng.random() < 0.9 else rng.choice([1, 5, 7, 8, 9, 3, *incomplete])
            ref.accept(token)
            chosen.append(token)
        ids = torch.cat([ids, torch.tensor(chosen)[:, None]], dim=1)


def test_waits_for_a_whole_utf8_character():
    # byte-level BPE: token 3 is the first byte of a 3-byte character, 4 its last two bytes, 5 'a'
    tokenizer = _byte_tokenizer()
    euro = tokenizer.convert_tokens_to_ids([_bytes_text(b"\xe2"), _bytes_text(b"\x82\xac")])
    assert tokenizer.decode(euro) == "€" and tokenizer.decode(euro[:1]).endswith("\ufffd")
    start, end, a = tokenizer.convert_tokens_to_ids(["<think>", "</think>", "a"])
    processor = ThinkingBudgetLogitsProcessor(2, "<think>", "</think>", tokenizer=tokenizer)
    assert processor.start_ids == [start] and processor.end_ids == [end]
    vocab = len(tokenizer)
    ids = torch.tensor([[a, start]])
    # 'a' spends one; the character's first byte spends the last but leaves it unfinished; its last
    # two bytes alone are no whole character either (llama.cpp reads each token's own bytes)
    for token in (a, euro[0], euro[1], a):
        assert processor(ids, torch.zeros(1, vocab)).isfinite().all()  # nothing forced yet
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    assert processor.phase.tolist() == [2]  # waiting
    assert processor(ids, torch.zeros(1, vocab)).isfinite().nonzero()[:, 1].tolist() == [end]


def _bytes_text(data):
    table = _byte_table()
    return "".join(table[b] for b in data)


def _byte_table():  # GPT-2's reversible byte -> printable character map
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<think>", "</think>", _bytes_text(b"\xe2"), _bytes_text(b"\x82\xac"), "a", "b"]
    backend = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    return tokenizer


# ---- rows in transformers' own generate, and the protocol ----

PROMPT = torch.tensor([[5, 9, 13, 2, 7, 21], [0, 0, 3, 4, 11, 7]])
MASK = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])


@pytest.mark.parametrize("hf_options", [dict(do_sample=False), dict(do_sample=True, top_k=0),
                                        dict(do_sample=False, num_beams=3)])
def test_hf_generate_with_the_class_equals_hfbridge_with_the_option(hf_options):
    hf = _model("llama")
    budget = 2 if hf_options.get("num_beams") else [2, 4]  # one value per row: rows are beams there
    options = dict(thinking_budget=budget, thinking_start=[21], thinking_end=[30, 31], thinking_budget_message=[40])
    torch.manual_seed(5)
    processor = ThinkingBudgetLogitsProcessor(budget, [21], [30, 31], [40])
    theirs = hf.generate(PROMPT, attention_mask=MASK, use_cache=False, max_new_tokens=10,
                         logits_processor=LogitsProcessorList([processor]), **hf_options)
    torch.manual_seed(5)
    ours = generate(Recompute(recompute_callable(hf)), PROMPT, attention_mask=MASK, max_new_tokens=10,
                    **options, **hf_options)
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"
    if not hf_options.get("num_beams"):
        # row 0's prompt ends with 21 (open span, budget 2): 2 tokens, then 40 30 31 forced
        assert theirs[0, 8:11].tolist() == [40, 30, 31]


def test_sample_step_loop_with_prompt_length_replays_the_generated_tokens():
    hf = _model("gpt2")
    model = recompute_callable(hf)
    options = dict(thinking_budget=3, thinking_start=[21], thinking_end=[30, 31])
    ids, mask = PROMPT.clone(), MASK.clone()
    for _ in range(8):  # a fresh processor every step: the state comes from the tokens
        nxt = sample_step(model(ids, mask), ids, prompt_length=6, **options)
        ids, mask = torch.cat([ids, nxt[:, None]], 1), torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)
    expected = generate(Recompute(model), PROMPT, attention_mask=MASK, max_new_tokens=8, **options)
    assert torch.equal(ids, expected)
    assert ids[0, 9:11].tolist() == [30, 31]


def test_rollback_and_repeat_give_the_state_of_the_shorter_sequence():
    budget = ThinkingBudgetLogitsProcessor(2, [7], [8])
    sequence = [1, 7, 3, 3, 8, 3, 7, 3]
    states = []
    for n in range(2, len(sequence) + 1):
        budget(torch.tensor([sequence[:n]]), torch.zeros(1, V))
        states.append(budget.phase.item())
    for n in (7, 5, 3):  # rewind to n tokens and take the step again
        budget.rollback(torch.tensor([n]))
        budget(torch.tensor([sequence[:n]]), torch.zeros(1, V))
        assert budget.phase.item() == states[n - 2]
    # a rewind then another token: as if the later tokens had never been seen
    budget.rollback(torch.tensor([4]))
    budget(torch.tensor([sequence[:4]]), torch.zeros(1, V))
    budget(torch.tensor([sequence[:4] + [8]]), torch.zeros(1, V))
    fresh = ThinkingBudgetLogitsProcessor(2, [7], [8])
    for n in range(2, 6):
        fresh(torch.tensor([(sequence[:4] + [8])[:n]]), torch.zeros(1, V))
    assert budget.phase.item() == fresh.phase.item() == 4


def test_reorder_follows_the_beams():
    budget = ThinkingBudgetLogitsProcessor([1, 5], [7], [8])
    ids = torch.tensor([[7, 3], [7, 3]])
    budget(ids, torch.zeros(2, V))
    budget.reorder(torch.tensor([1, 0]))  # row 0 continues row 1 (budget 5) and back
    # rows whose tokens are identical: the processor trusts the reorder (same row first)
    budget(torch.tensor([[7, 3, 3], [7, 3, 3]]), torch.zeros(2, V))
    assert budget.phase.tolist() == [1, 3]  # row 0 counts on; row 1 (budget 1 in this row) forces


def test_no_host_reads_and_input_untouched():
    budget = ThinkingBudgetLogitsProcessor([2, 3], [7], [8, 9], [10])
    ids = torch.tensor([[1, 7], [7, 2]])
    budget(ids, torch.zeros(2, V))
    scores = torch.randn(2, V)
    before = scores.clone()
    with accelerator_route(), HostReads() as reads:  # what an accelerator runs (on CPU a host read is free)
        for _ in range(4):
            ids = torch.cat([ids, torch.full((2, 1), 3)], 1)
            budget(ids, scores)
    assert reads.count == 0, reads.ops
    assert torch.equal(scores, before)


def test_while_nothing_is_forced_the_scores_come_back_as_they_came_and_forcing_writes_a_new_tensor():
    budget = ThinkingBudgetLogitsProcessor(2, [7], [8], prompt_length=0)
    scores = torch.randn(1, V)
    before = scores.clone()
    outputs = []
    ids = torch.tensor([[7]])
    for _ in range(4):  # counting, counting, forcing the end tag, done
        outputs.append(LogitsProcessorList([budget])(ids, scores))
        ids = torch.cat([ids, torch.tensor([[3]])], 1)
    assert [out is scores for out in outputs] == [True, True, False, True] and torch.equal(scores, before)
    assert torch.isfinite(outputs[2][0]).nonzero().flatten().tolist() == [8]


@pytest.mark.parametrize("args,error,message", [
    (dict(budget=-1), ValueError, r"^`budget` must be >= 0, got -1.$"),
    (dict(budget=True), TypeError, r"^`budget` must be an int, got bool True.$"),
    (dict(budget=1.5), TypeError, r"^`budget` must be an int, got float 1.5.$"),
    (dict(start_ids=[]), ValueError, r"^`start_ids` is empty"),
    (dict(end_ids="</think>"), ValueError, r"^`end_ids` is a string \('</think>'\): pass `tokenizer=`"),
    (dict(end_ids=[8, -1]), TypeError, r"^`end_ids` must be a string or a sequence of token ids"),
    (dict(message_ids=3), TypeError, r"^`message_ids` must be a string or a sequence of token ids"),
    (dict(prompt_length=-2), ValueError, r"^`prompt_length` must be an int >= 0"),
])
def test_errors_name_the_argument(args, error, message):
    kwargs = dict(budget=2, start_ids=[7], end_ids=[8])
    kwargs.update(args)
    with pytest.raises(error, match=message):
        ThinkingBudgetLogitsProcessor(**kwargs)


def test_tags_outside_the_vocabulary():
    with pytest.raises(ValueError, match=r"token id 20, outside the scores' vocabulary of 16 tokens"):
        ThinkingBudgetLogitsProcessor(1, [7], [20])(torch.tensor([[1]]), torch.zeros(1, V))


@pytest.mark.parametrize("options,error,message", [
    (dict(thinking_budget=2), ValueError,
     r"^`thinking_start` is a string \('<think>'\): pass `tokenizer=`.*the default tags are the strings"),
    (dict(thinking_budget=-3, thinking_start=[7], thinking_end=[8]), ValueError,
     r"^`thinking_budget` must be >= 0, got -3.$"),
    (dict(thinking_budget=2, thinking_start=[], thinking_end=[8]), ValueError, r"^`thinking_start` is empty"),
    (dict(thinking_budget=2, thinking_start=[7], thinking_end=8), TypeError,
     r"^`thinking_end` must be a string or a sequence of token ids"),
    (dict(thinking_budget=[1, 2, 3], thinking_start=[7], thinking_end=[8]), ValueError,
     r"^`thinking_budget` has 3 values, one per row, but the step has 2 rows; pass one value per row, or a single number "
     r"for every row.$"),
])
def test_option_errors_name_the_option(options, error, message):
    with pytest.raises(error, match=message):
        sample_step(torch.zeros(2, V), torch.tensor([[1], [2]]), **options)


def test_options_with_a_tokenizer_and_greedy():
    tokenizer = _byte_tokenizer()
    start, end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    logits = torch.zeros(1, len(tokenizer))
    logits[0, 4] = 3.0
    ids = torch.tensor([[start]])
    # budget 0 with the prompt opening the span: the end tag at once, in greedy too
    assert sample_step(logits, ids, thinking_budget=0, tokenizer=tokenizer).tolist() == [end]


def test_hf_assisted_decoding_follows_the_rows_through_rejections():
    # greedy assisted decoding returns greedy decoding's tokens; the budget's state must survive the drafts
    # transformers rejects (a call at a length it saw before, with another token at the last position)
    hf, draft = _model("llama"), _model("gpt2")
    prompt = torch.tensor([[5, 9, 13, 2, 7, 21]])

    def budget():
        return LogitsProcessorList([ThinkingBudgetLogitsProcessor(3, [21], [30, 31], [40])])

    plain = hf.generate(prompt, max_new_tokens=14, do_sample=False, logits_processor=budget())
    assisted = hf.generate(prompt, max_new_tokens=14, do_sample=False, logits_processor=budget(),
                           assistant_model=draft, num_assistant_tokens=4)
    assert torch.equal(assisted, plain)
    assert plain[0, 9:12].tolist() == [40, 30, 31]


def test_numpy_ids_and_a_step_without_context():
    import numpy as np

    budget = ThinkingBudgetLogitsProcessor(np.int64(0), np.array([7]), [np.int64(8), 9])
    assert (budget.start_ids, budget.end_ids, budget.budget.values) == ([7], [8, 9], (0,))
    assert budget(torch.tensor([[1, 7]]), torch.zeros(1, V)).isfinite().nonzero()[:, 1].tolist() == [8]
    # no tokens at all (sample_step without input_ids): nothing to count, nothing forced
    scores = torch.randn(2, V)
    assert torch.equal(sample_step(scores, thinking_budget=0, thinking_start=np.array([7]), thinking_end=[8]),
                       scores.argmax(-1))


def _split_tag_tokenizer():
    """`<think>` and `</think>` are entries of a word-level vocabulary, but `encode("<think>")` splits them
    at the punctuation into `[UNK]`, `think`, `[UNK]`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<think>": 1, "</think>": 2, "a": 3, "b": 4, "think": 5}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    assert tokenizer.encode("<think>", add_special_tokens=False) == [0, 5, 0]
    return tokenizer


def test_a_tag_that_is_a_vocabulary_entry_but_encodes_split_is_found():
    tokenizer = _split_tag_tokenizer()
    processor = ThinkingBudgetLogitsProcessor(1, "<think>", "</think>", tokenizer=tokenizer)
    assert (processor.start_ids, processor.end_ids) == ([1], [2])
    # the budget triggers: the prompt opens the span, one thinking token, then the end tag is forced
    def model(input_ids):
        logits = torch.zeros(*input_ids.shape, len(tokenizer))
        logits[..., 3] = 5.0
        return logits
    out = generate(model, torch.tensor([[4, 1]]), max_new_tokens=3, thinking_budget=1,
                   tokenizer=tokenizer)
    assert out[0, 2:].tolist() == [3, 2, 3]


@pytest.mark.parametrize("options,message", [
    (dict(thinking_start="<thought>"),
     r"^`thinking_start` '<thought>' is not a token of the tokenizer and encodes to unknown tokens \(\[0, 0, 0\], "
     r"unk_token_id=0\), so it could never be matched; pass a string the tokenizer knows, or the tag's token ids.$"),
    (dict(thinking_end="</thought>"),
     r"^`thinking_end` '</thought>' is not a token of the tokenizer and encodes to unknown tokens"),
])
def test_a_tag_that_encodes_to_unknown_tokens_is_refused(options, message):
    tokenizer = _split_tag_tokenizer()
    with pytest.raises(ValueError, match=message):
        sample_step(torch.zeros(1, len(tokenizer)), torch.tensor([[1]]), thinking_budget=2, tokenizer=tokenizer,
                    **options)
