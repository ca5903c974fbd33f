"""`hfbridge.generate` on custom (non-HF) models: every model form, the per-step extra-input hook,
stop strings, streamers, stopping criteria, and every error (exact messages, raised before the
first model call where the input alone is wrong). Parity with HF models: test_generate_parity.py.
"""

from __future__ import annotations

import doctest
import re
import sys
import threading
import time
import warnings

import pytest
import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    StoppingCriteria,
    TextIteratorStreamer,
    TextStreamer,
)
from transformers.generation.streamers import BaseStreamer

import hfbridge._generate.generate
import hfbridge._models.adapters
from hfbridge import Hooks, InputPos, Recompute, ReturnsCache, generate

from _tiny_models import (
    TinyCached,
    TinyCore,
    TinyFast,
    TinyMasked,
    TinyRecompute,
    char_tokenizer,
    recompute_callable,
    tiny_gpt2,
)

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf")

V = 32  # TinyCore's vocabulary


@pytest.fixture(scope="module")
def core():
    return TinyCore(vocab=V, seed=0)


class Counting:
    """A plain model that counts its calls: `model(idx) -> logits`, from a fixed table."""

    def __init__(self, vocab=V, seed=0):
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed))
        self.calls = 0

    def __call__(self, idx):
        self.calls += 1
        return self.table[idx]  # [B, T, V]


def script_model(text, tokenizer):
    """A model that spells `text`: the logits at position t predict text[(t + 1) % len]."""
    ids = tokenizer(text).input_ids
    vocab = len(tokenizer)

    def model(idx):  # [B, T] -> [B, T, V]
        positions = torch.arange(idx.shape[1])
        targets = torch.tensor(ids)[(positions + 1) % len(ids)]
        return torch.nn.functional.one_hot(targets, vocab).float().expand(idx.shape[0], -1, -1) * 10

    return model


PROMPT = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])


# ------------------------------------------------------------------------------------------
# The model forms
# ------------------------------------------------------------------------------------------


def test_plain_callable_is_recompute_and_matches_a_hand_written_loop():
    model = Counting()
    out = generate(model, PROMPT, max_new_tokens=4)
    x = PROMPT.clone()
    for _ in range(4):
        x = torch.cat([x, model.table[x][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, x)
    assert model.calls == 4  # one call per new token


def test_recompute_max_context_crops_input_and_mask():
    seen = []

    def model(idx, attention_mask):
        seen.append((tuple(idx.shape), tuple(attention_mask.shape)))
        return torch.zeros(idx.shape[0], idx.shape[1], V)

    generate(Recompute(model, max_context=3), PROMPT, max_new_tokens=3)
    assert seen == [((2, 3), (2, 3))] * 3
    seen.clear()
    generate(model, PROMPT, max_new_tokens=2, max_context=6)  # the shorthand
    assert seen == [((2, 5), (2, 5)), ((2, 6), (2, 6))]


def test_recompute_passes_the_whole_mask_only_when_the_signature_names_it():
    masks = []

    def with_mask(idx, attention_mask=None):
        masks.append(attention_mask)
        return torch.zeros(idx.shape[0], idx.shape[1], V)

    def with_kwargs(idx, **kwargs):
        masks.append(kwargs)
        return torch.zeros(idx.shape[0], idx.shape[1], V)

    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    generate(with_mask, PROMPT, attention_mask=mask, max_new_tokens=2)
    assert torch.equal(masks[0], mask)
    assert torch.equal(masks[1], torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1))
    masks.clear()
    generate(with_kwargs, PROMPT, max_new_tokens=1)
    assert masks == [{}]


def test_left_padded_batch_matches_each_prompt_alone(core):
    model = TinyMasked(core)
    long, short = [7, 8, 9, 10, 11], [4, 5, 6]
    batch = torch.tensor([long, [0, 0] + short])
    mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]])
    out = generate(model, batch, attention_mask=mask, max_new_tokens=5)
    alone = generate(model, torch.tensor([short]), max_new_tokens=5)
    assert torch.equal(out[1, 2:], alone[0])
    cached = generate(ReturnsCache(TinyCached(core)), batch, attention_mask=mask, max_new_tokens=5)
    assert torch.equal(cached, out)


def test_every_form_of_one_model_gives_the_same_tokens(core):
    prompt = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    expected = generate(TinyRecompute(core), prompt, max_new_tokens=6)

    fast = TinyFast(core)
    fast.setup_caches(max_batch_size=2, max_seq_length=16)
    assert torch.equal(generate(InputPos(fast), prompt, max_new_tokens=6), expected)
    # gpt-fast's prefill then decode_one_token: the prompt once, then one token at its position
    assert fast.calls[:3] == [((2, 4), [0, 1, 2, 3]), ((2, 1), [4]), ((2, 1), [5])]

    assert torch.equal(generate(ReturnsCache(TinyCached(core)), prompt, max_new_tokens=6), expected)

    def prepare_inputs(input_ids, *, attention_mask, cache=None):
        new = input_ids if cache is None else input_ids[:, -1:]
        return {"idx": new, "cache": cache, "attention_mask": attention_mask}

    def update_state(outputs, state):
        return {**state, "cache": outputs[1]}

    hooks = Hooks(TinyCached(core), prepare_inputs, update_state)
    assert torch.equal(generate(hooks, prompt, max_new_tokens=6), expected)


def test_returns_cache_feeds_the_prompt_once_then_one_token_with_the_cache():
    calls = []

    def model(idx, cache):
        calls.append((idx.tolist(), cache))
        return torch.zeros(idx.shape[0], idx.shape[1], V), len(calls)

    out = generate(ReturnsCache(model), torch.tensor([[4, 5, 6]]), max_new_tokens=3, return_dict_in_generate=True)
    assert calls == [([[4, 5, 6]], None), ([[0]], 1), ([[0]], 2)]
    assert out.past_key_values == 3 and out.sequences.tolist() == [[4, 5, 6, 0, 0, 0]]


def test_hooks_add_a_per_step_feature_and_carry_outputs_forward():
    """The extra-input hook: a (batch, total_len, vocab) feature tensor, one slice per step."""
    steps = 5
    targets = torch.tensor([[3, 1, 4, 1, 5], [2, 7, 1, 8, 2]])
    features = torch.zeros(2, 3 + steps, V)  # position t's feature picks the token after t
    features[:, 2:2 + steps] = torch.nn.functional.one_hot(targets, V).float() * 5

    def model(tokens, feature, past):  # a "model" that trusts the feature and counts its calls
        return torch.zeros(tokens.shape[0], tokens.shape[1], V) + feature, past + 1

    def prepare_inputs(input_ids, *, feature, past=0, attention_mask):
        position = input_ids.shape[1] - 1
        return {"tokens": input_ids[:, -1:], "feature": feature[:, position:position + 1], "past": past}

    def update_state(outputs, state):
        return {**state, "past": outputs[1]}

    seen = []
    original = update_state

    def recording_update(outputs, state):
        seen.append(state.get("past", 0))
        return original(outputs, state)

    out = generate(Hooks(model, prepare_inputs, recording_update), torch.tensor([[9, 9, 9]] * 2),
                   max_new_tokens=steps, feature=features)
    assert torch.equal(out[:, 3:], targets)
    assert seen == [0, 1, 2, 3, 4]  # what update_state returned came back next step


def test_model_inputs_reach_the_model_and_follow_num_return_sequences():
    received = []

    def model(idx, bias, scale=1.0):
        received.append((tuple(bias.shape), scale))
        return torch.zeros(idx.shape[0], idx.shape[1], V) + bias[:, None, :] * scale

    bias = torch.zeros(2, V)
    bias[0, 5] = bias[1, 7] = 10.0
    out = generate(model, PROMPT, max_new_tokens=2, bias=bias, scale=2.0, do_sample=True, num_return_sequences=3)
    assert out.shape == (6, 7)
    assert out[:3, 5:].eq(5).all() and out[3:, 5:].eq(7).all()
    assert received == [((6, V), 2.0)] * 2


def test_input_pos_refuses_left_padding(core):
    fast = TinyFast(core)
    fast.setup_caches(2, 16)
    with pytest.raises(ValueError, match=re.escape(
        "`attention_mask` has padding (zeros), but an InputPos model (model(idx, input_pos)) takes no "
        "attention mask and would attend to the padding."
    )):
        generate(InputPos(fast), PROMPT, attention_mask=torch.tensor([[1] * 5, [0, 1, 1, 1, 1]]), max_new_tokens=2)
    assert fast.calls == []


# ------------------------------------------------------------------------------------------
# HF semantics
# ------------------------------------------------------------------------------------------


def test_eos_pads_finished_rows_and_stops_when_all_are_done():
    table = torch.full((V, V), -5.0)
    table[3, 10] = table[10, 0] = table[9, 11] = table[11, 12] = table[12, 0] = 5.0  # 0 is eos
    out = generate(lambda idx: table[idx], torch.tensor([[3], [9]]), max_new_tokens=8, eos_token_id=0, pad_token_id=2)
    assert out.tolist() == [[3, 10, 0, 2], [9, 11, 12, 0]]
    # min_new_tokens keeps eos away for 3 steps; pad defaults to eos as in HF
    table_out = generate(lambda idx: table[idx], torch.tensor([[3]]), max_new_tokens=4, eos_token_id=0,
                         min_new_tokens=3)
    assert table_out[0, 1:4].ne(0).all()


def test_mask_is_inferred_from_pad_tokens_as_hf_does():
    hf = tiny_gpt2()
    prompt = torch.tensor([[5, 9, 13, 2, 7], [1, 1, 3, 4, 11]])  # pad_token_id=1 on the left
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = hf.generate(prompt, max_new_tokens=4, pad_token_id=1, use_cache=False)
        ours = generate(recompute_callable(hf), prompt, max_new_tokens=4, pad_token_id=1)
    assert torch.equal(ours, theirs)


def test_stop_strings_with_a_local_tokenizer():
    tokenizer = char_tokenizer()
    model = script_model("say stop now and more", tokenizer)
    prompt = torch.tensor([tokenizer("x").input_ids])
    out = generate(model, prompt, max_new_tokens=15, stop_strings=["stop"], tokenizer=tokenizer)
    assert tokenizer.decode(out[0]) == "xay stop"


def test_stop_strings_match_hf():
    tokenizer = char_tokenizer()
    hf = tiny_gpt2()  # 48 columns for 45 tokens: ids >= 45 decode to nothing
    prompt = torch.tensor([tokenizer("ab").input_ids])
    free = generate(recompute_callable(hf), prompt, max_new_tokens=10)
    text = tokenizer.decode(free[0, 2:5])
    assert len(text) >= 2, "need a stop string that occurs"
    stop = text[-2:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = hf.generate(prompt, max_new_tokens=10, stop_strings=[stop], tokenizer=tokenizer, use_cache=False)
    ours = generate(recompute_callable(hf), prompt, max_new_tokens=10, stop_strings=[stop], tokenizer=tokenizer)
    assert torch.equal(ours, theirs) and ours.shape[1] < free.shape[1]


class Recorder(BaseStreamer):
    def __init__(self):
        self.events = []

    def put(self, value):
        self.events.append(("put", value.tolist()))

    def end(self):
        self.events.append(("end",))


def test_streamer_receives_what_hf_sends():
    hf = tiny_gpt2()
    prompt = torch.tensor([[5, 9, 13]])
    theirs, ours = Recorder(), Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.generate(prompt, max_new_tokens=4, streamer=theirs, use_cache=False)
    generate(recompute_callable(hf), prompt, max_new_tokens=4, streamer=ours)
    assert ours.events == theirs.events
    assert ours.events[0] == ("put", [[5, 9, 13]]) and ours.events[-1] == ("end",)
    assert len(ours.events) == 1 + 4 + 1


def test_text_streamer_prints_the_generated_text(capsys):
    tokenizer = char_tokenizer()
    model = script_model("hello world", tokenizer)
    prompt = torch.tensor([tokenizer("h").input_ids])
    out = generate(model, prompt, max_new_tokens=10, streamer=TextStreamer(tokenizer, skip_prompt=True))
    assert tokenizer.decode(out[0]) == "hello world"
    assert capsys.readouterr().out == "ello world\n"


def test_text_iterator_streamer_from_a_thread():
    tokenizer = char_tokenizer()
    model = script_model("streaming works", tokenizer)
    prompt = torch.tensor([tokenizer("s").input_ids])
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=10)
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=generate(
        model, prompt, max_new_tokens=14, streamer=streamer)))
    thread.start()
    text = "".join(streamer)
    thread.join(timeout=10)
    assert text == "treaming works"
    assert tokenizer.decode(result["out"][0]) == "streaming works"


def test_text_iterator_streamer_ends_when_the_model_fails():
    tokenizer = char_tokenizer()
    streamer = TextIteratorStreamer(tokenizer, timeout=10)
    calls = []

    def failing(idx):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("out of memory")
        return torch.zeros(1, idx.shape[1], len(tokenizer))

    errors = []

    def run():
        try:
            generate(failing, torch.tensor([[2]]), max_new_tokens=10, streamer=streamer)
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    list(streamer)  # returns instead of waiting for the 10 s timeout
    thread.join(timeout=10)
    assert len(errors) == 1


def test_user_stopping_criteria_and_max_time():
    class StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 7, dtype=torch.bool)

    out = generate(Counting(), PROMPT, max_new_tokens=10, stopping_criteria=[StopAfter()])
    assert out.shape == (2, 7)

    def slow(idx):
        time.sleep(0.02)
        return torch.zeros(idx.shape[0], idx.shape[1], V)

    out = generate(slow, PROMPT, max_new_tokens=100, max_time=0.1)
    assert 5 < out.shape[1] < 100


def test_generation_config_plus_overrides_and_defaults():
    model = Counting()
    config = GenerationConfig(max_new_tokens=3, do_sample=False)
    before = config.to_dict()
    assert generate(model, PROMPT, generation_config=config).shape == (2, 8)
    assert generate(model, PROMPT, generation_config=config, max_new_tokens=5).shape == (2, 10)
    assert config.to_dict() == before


def test_sampling_is_reproducible_with_the_global_seed_or_a_generator():
    model = Counting()
    torch.manual_seed(7)
    first = generate(model, PROMPT, max_new_tokens=6, do_sample=True)
    torch.manual_seed(7)
    assert torch.equal(generate(model, PROMPT, max_new_tokens=6, do_sample=True), first)
    state = torch.get_rng_state()
    a = generate(model, PROMPT, max_new_tokens=6, do_sample=True, generator=torch.Generator().manual_seed(3))
    b = generate(model, PROMPT, max_new_tokens=6, do_sample=True, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and torch.equal(torch.get_rng_state(), state)


def test_processors_are_called_once_per_new_token_and_fresh_per_call():
    class Recording(LogitsProcessor):
        def __init__(self):
            self.lengths = []

        def __call__(self, input_ids, scores):
            self.lengths.append(input_ids.shape[1])
            return scores

    recording = Recording()
    generate(Counting(), PROMPT, max_new_tokens=4, processors=[recording], repetition_penalty=1.3)
    assert recording.lengths == [5, 6, 7, 8]
    model = Counting()
    options = dict(max_new_tokens=6, no_repeat_ngram_size=2, sequence_bias={(3,): 2.0}, repetition_penalty=1.5)
    assert torch.equal(generate(model, PROMPT, **options), generate(model, PROMPT, **options))


def test_padded_vocabulary_is_never_chosen():
    def model(idx):
        logits = torch.zeros(idx.shape[0], idx.shape[1], 40)
        logits[..., 32:] = 100.0  # padding columns the model never trained
        return logits

    torch.manual_seed(0)
    out = generate(model, PROMPT, max_new_tokens=5, vocab_size=32, do_sample=True)
    assert out[:, 5:].lt(32).all()


def test_return_dict_with_scores_and_logits():
    model = Counting()
    out = generate(model, PROMPT, max_new_tokens=3, return_dict_in_generate=True, output_scores=True,
                   output_logits=True, temperature=0.5, do_sample=True)
    assert type(out).__name__ == "GenerateDecoderOnlyOutput"
    assert len(out.scores) == len(out.logits) == 3
    step0 = model.table[PROMPT][:, -1]
    torch.testing.assert_close(out.logits[0], step0)
    torch.testing.assert_close(out.scores[0], step0 / 0.5)


def test_fast_path_and_progress_bar(capsys):
    pytest.importorskip("tqdm")
    out = generate(Counting(), PROMPT, max_new_tokens=4, do_sample=True, top_p=0.9, fast=True, progress=True)
    assert out.shape == (2, 9)
    assert "generate" in capsys.readouterr().err


def test_progress_bar_without_tqdm_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    message = "install it with `pip install tqdm` (or, in a clone of hfbridge, `pip install -e \".[progress]\"`)."
    with pytest.raises(ImportError, match=re.escape(message)):
        generate(Counting(), PROMPT, max_new_tokens=2, progress=True)


def test_caller_tensors_are_never_modified():
    def inplace_processor(input_ids, scores):
        scores[:, 0] = -1e9  # HF processors may write into scores; ours is a private copy
        return scores

    logits_seen = []

    def model(idx, attention_mask, extra):
        logits = torch.randn(idx.shape[0], idx.shape[1], V, generator=torch.Generator().manual_seed(idx.shape[1]))
        logits_seen.append((logits, logits.clone()))
        return logits

    prompt = PROMPT.clone()
    mask = torch.tensor([[1] * 5, [0, 1, 1, 1, 1]])
    extra = torch.ones(2, 3)
    copies = prompt.clone(), mask.clone(), extra.clone()
    generate(model, prompt, attention_mask=mask, extra=extra, max_new_tokens=3, processors=[inplace_processor],
             repetition_penalty=1.5, num_return_sequences=1)
    assert torch.equal(prompt, copies[0]) and torch.equal(mask, copies[1]) and torch.equal(extra, copies[2])
    assert all(torch.equal(a, b) for a, b in logits_seen)


# ------------------------------------------------------------------------------------------
# Errors: exact messages; input errors come before the first model call
# ------------------------------------------------------------------------------------------


def _raises_before_any_call(exception, message, **kwargs):
    model = kwargs.pop("model", None) or Counting()
    prompt = kwargs.pop("input_ids", PROMPT)
    with pytest.raises(exception, match=re.escape(message)):
        generate(model, prompt, **kwargs)
    assert not getattr(getattr(model, "model", model), "calls", 0)  # an adapter's model, or the model


def test_max_new_tokens_below_one():
    _raises_before_any_call(ValueError, "`max_new_tokens` must be an int >= 1, got 0.", max_new_tokens=0)
    _raises_before_any_call(ValueError, "`max_new_tokens` must be an int >= 1, got -2.",
                            generation_config=GenerationConfig(), max_new_tokens=-2)


def test_stop_strings_without_tokenizer():
    _raises_before_any_call(
        ValueError,
        "`stop_strings`=['end'] needs `tokenizer=`: HF's StopStringCriteria matches the strings against the "
        "tokenizer's vocabulary. Pass the tokenizer that made `input_ids`.",
        max_new_tokens=3, stop_strings=["end"])


def test_streamer_that_cannot_take_the_batch():
    tokenizer = char_tokenizer()
    _raises_before_any_call(
        ValueError,
        "`streamer` is a TextStreamer, which streams one sequence, but generate() would produce 2 (2 prompts x "
        "num_return_sequences=1); pass one prompt with num_return_sequences=1, or a streamer of your own that "
        "handles batches.",
        max_new_tokens=3, streamer=TextStreamer(tokenizer))
    _raises_before_any_call(
        ValueError, "would produce 3 (1 prompts x num_return_sequences=3)",
        input_ids=PROMPT[:1], max_new_tokens=3, streamer=TextIteratorStreamer(tokenizer), do_sample=True,
        num_return_sequences=3)
    _raises_before_any_call(TypeError, "`streamer` must have put(token_ids) and end() methods (a transformers "
                                       "streamer), got list.", max_new_tokens=3, streamer=[])


def test_unknown_keyword_is_a_model_input_the_model_must_accept():
    _raises_before_any_call(
        TypeError,
        "generate() got `temprature`, which is neither a generation option nor an input the model accepts "
        "(the model's parameters: idx). Did you mean `temperature`?",
        max_new_tokens=3, temprature=0.5)
    _raises_before_any_call(TypeError, "generate() got both `processors=` and `logits_processor=` (HF's name for "
                                       "the same argument); pass your logits processors once.",
                            max_new_tokens=3, logits_processor=[], processors=[])
    fast = TinyFast(TinyCore())
    _raises_before_any_call(
        TypeError, "generate() got the model input `input_pos`, but InputPos supplies `input_pos` itself",
        model=InputPos(fast), max_new_tokens=3, input_pos=torch.arange(5))


def test_bad_prompt_and_mask():
    _raises_before_any_call(ValueError, "`input_ids` must be (batch, seq), got shape (5,) (for one prompt, pass "
                                        "input_ids[None]).", input_ids=PROMPT[0], max_new_tokens=3)
    _raises_before_any_call(TypeError, "`input_ids` must hold integer token ids, got dtype torch.float32.",
                            input_ids=PROMPT.float(), max_new_tokens=3)
    _raises_before_any_call(ValueError, "`attention_mask` must have the shape of `input_ids` (2, 5), got (2, 4).",
                            attention_mask=torch.ones(2, 4), max_new_tokens=3)
    _raises_before_any_call(ValueError, "`attention_mask` row 1 is all zeros: every prompt needs at least one token.",
                            attention_mask=torch.tensor([[1] * 5, [0] * 5]), max_new_tokens=3)
    _raises_before_any_call(ValueError, "Input length of input_ids is 5, but `max_length` is set to 4.",
                            max_length=4)


def test_unsupported_modes():
    _raises_before_any_call(ValueError, "generate() does not support group beam search (selected by num_beam_groups "
                                        "> 1): transformers 5 moved it out of its core",
                            max_new_tokens=3, num_beams=4, num_beam_groups=2, diversity_penalty=0.5)
    _raises_before_any_call(ValueError, "generate() does not support `penalty_alpha`=0.6: contrastive search re-ranks "
                                        "candidates with the model's hidden states.", max_new_tokens=3,
                            penalty_alpha=0.6, top_k=4)
    # guidance_scale runs (tests/generate/test_guidance_watermark.py)
    _raises_before_any_call(ValueError, "`output_attentions=True` needs the model's internals, which generate() "
                                        "does not see", max_new_tokens=3, output_attentions=True)


def test_prompt_token_outside_the_vocabulary():
    with pytest.raises(ValueError, match=re.escape(
        "generate(): at step 0: `input_ids` hold token id 40, outside the vocabulary of 32 tokens"
    )):
        generate(lambda idx: torch.zeros(idx.shape[0], idx.shape[1], V), torch.tensor([[1, 40]]), max_new_tokens=2)


def _flaky(fault, at_step):
    calls = []

    def model(idx):
        calls.append(1)
        logits = torch.zeros(idx.shape[0], idx.shape[1], V)
        return fault(logits) if len(calls) == at_step + 1 else logits

    return model


def test_wrong_batch_from_the_model():
    with pytest.raises(ValueError, match=re.escape(
        "generate(): at step 2 the model returned logits of shape (1, 7, 32) (layout 'b t v'), which give 1 rows, "
        "expected 2: one per sequence (2 prompts x num_return_sequences=1)."
    )):
        generate(_flaky(lambda logits: logits[:1], at_step=2), PROMPT, max_new_tokens=5)


def test_wrong_vocabulary_from_the_model():
    with pytest.raises(ValueError, match=re.escape(
        "generate(): at step 1 the model returned logits with 31 vocabulary columns, but 32 at step 0; "
        "the vocabulary size must stay the same."
    )):
        generate(_flaky(lambda logits: logits[..., :31], at_step=1), PROMPT, max_new_tokens=5)


def test_nan_from_the_model():
    def nan_row(logits):
        logits[1, -1, 3] = float("nan")
        return logits

    with pytest.raises(ValueError, match=re.escape(
        "generate(): at step 3: `logits` contain NaN in row 1 (1 of 2 rows have NaN); check the model's forward pass"
    )):
        generate(_flaky(nan_row, at_step=3), PROMPT, max_new_tokens=5)


def test_model_exception_propagates_with_the_step():
    def boom(logits):
        raise RuntimeError("CUDA out of memory")

    with pytest.raises(RuntimeError, match="CUDA out of memory") as info:
        generate(_flaky(boom, at_step=2), PROMPT, max_new_tokens=5)
    assert getattr(info.value, "__notes__", []) == [
        "hfbridge.generate: raised at step 2 (step 0 is the prompt's forward pass; 7 tokens so far, 2 generated)."
    ]


def test_adapter_output_errors_name_the_step():
    with pytest.raises(TypeError, match=re.escape(
        "generate(): at step 0: a ReturnsCache model must return a pair (logits, cache), got Tensor of shape "
        "(2, 5, 32); return `logits, cache` (or use Recompute for a model that returns only logits)."
    )):
        generate(ReturnsCache(lambda idx, cache: torch.zeros(idx.shape[0], idx.shape[1], V)), PROMPT, max_new_tokens=2)
    with pytest.raises(TypeError, match=re.escape(
        "generate(): at step 0: prepare_inputs must return a dict of keyword arguments for the model, got list of 1."
    )):
        generate(Hooks(Counting(), lambda input_ids, **state: [input_ids]), PROMPT, max_new_tokens=2)
    with pytest.raises(TypeError, match=re.escape(
        "generate(): at step 0: prepare_inputs returned `tokens`, which the model does not accept "
        "(the model's parameters: idx)."
    )):
        generate(Hooks(Counting(), lambda input_ids, **state: {"tokens": input_ids}), PROMPT, max_new_tokens=2)


def test_hooks_must_take_the_mask():
    _raises_before_any_call(
        TypeError, "prepare_inputs must accept the state's `attention_mask` (its parameters: input_ids); add "
                   "`attention_mask=None` or `**state`.",
        model=Hooks(Counting(), lambda input_ids: {"idx": input_ids}), max_new_tokens=2)


def test_adapter_construction_errors():
    with pytest.raises(ValueError, match=re.escape("`max_context` must be a positive int (the model's context "
                                                   "window), got 0.")):
        Recompute(Counting(), max_context=0)
    with pytest.raises(TypeError, match=re.escape("`model` must be callable (an nn.Module or a function), got int.")):
        Recompute(3)
    with pytest.raises(TypeError, match=re.escape("`max_context` applies to plain callables (Recompute), but "
                                                  "`model` is a ReturnsCache.")):
        generate(ReturnsCache(Counting()), PROMPT, max_new_tokens=2, max_context=4)


@pytest.mark.parametrize("module", [hfbridge._generate.generate, hfbridge._models.adapters], ids=lambda module: module.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_an_hf_model_itself():
    """A `PreTrainedModel` passed as it is gets the `HFModel` adapter (tests/models/test_hf_model.py); with
    `Recompute` it is a plain callable returning a `ModelOutput`, whose `.logits` are used."""
    hf = tiny_gpt2()
    prompt = torch.tensor([[5, 9, 13, 2]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = hf.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=False)
    assert torch.equal(generate(hf, prompt, max_new_tokens=5, use_cache=False), theirs)
    assert torch.equal(generate(Recompute(hf), prompt, max_new_tokens=5), theirs)


def test_other_logits_layouts():
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(1))

    def time_major(idx):  # [T, B, V]
        return table[idx].transpose(0, 1)

    expected = generate(lambda idx: table[idx], PROMPT, max_new_tokens=3)
    assert torch.equal(generate(time_major, PROMPT, max_new_tokens=3, layout="t b v"), expected)
    assert torch.equal(generate(lambda idx: {"logits": table[idx][:, -1]}, PROMPT, max_new_tokens=3), expected)


def test_runs_without_autograd():
    grads = []

    def model(idx):
        grads.append(torch.is_grad_enabled())
        return Counting().table[idx]

    generate(model, PROMPT, max_new_tokens=2)
    assert grads == [False, False] and torch.is_grad_enabled()
