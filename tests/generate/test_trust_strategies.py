"""Hostile inputs to what 0.1 added: cache hooks, beams, drafts, prompt lookup,
`prefix_allowed_tokens_fn`, `check_every`, `compute_transition_scores`, `explain_generation`.
Each gets HF's answer or an error naming the argument, before any wrong token."""

import math
import re

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hfbridge import (
    Hooks,
    ModelAdapter,
    Recompute,
    ReturnsCache,
    compute_transition_scores,
    explain_generation,
    explain_step,
    generate,
)
from hfbridge._models.cache import CacheTypeError

from _tiny_models import TinyCached, TinyCore, TinyMasked, TinyRecompute, char_tokenizer

PROMPT = torch.tensor([[3, 9, 4, 1]])
BEAMS = dict(max_new_tokens=5, num_beams=3)


def _core():
    return TinyCore(vocab=32)


def _expected(core, **options):
    return generate(TinyRecompute(core), PROMPT, **options)


class Counting:
    """A bigram model counting its calls."""

    def __init__(self, vocab=10):
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0))
        self.calls = 0

    def __call__(self, input_ids):
        self.calls += 1
        return self.table[input_ids]


# ---- 1. a cache hook that returns nothing ----

def _in_place_reorder(cache, beam_idx):  # forgets `return`
    cache[0][:] = cache[0][beam_idx]


def test_returns_cache_reorder_hook_returning_none_is_an_error():
    with pytest.raises(TypeError) as error:
        generate(ReturnsCache(TinyCached(_core()), reorder_cache=lambda cache, beam_idx: None), PROMPT, **BEAMS)
    assert str(error.value) == (
        "generate(): after step 0: the reorder_cache hook returned None for a cache of type tuple; it must return "
        "the cache, `reorder_cache(cache, beam_idx) -> cache` (a hook that edits the cache in place still ends with "
        "`return cache`)."
    )


def test_returns_cache_reorder_hook_that_returns_works():
    core = _core()
    hooked = ReturnsCache(TinyCached(core), reorder_cache=lambda cache, beam_idx: tuple(t[beam_idx] for t in cache))
    assert torch.equal(generate(hooked, PROMPT, **BEAMS), _expected(core, **BEAMS))


def test_returns_cache_crop_hook_returning_none_is_an_error():
    core = _core()
    with pytest.raises(TypeError, match=re.escape(
            "generate(): after step 0, rolling back rejected draft tokens: the crop_cache hook returned None for a "
            "cache of type tuple; it must return the cache, `crop_cache(cache, length) -> cache`")):
        generate(ReturnsCache(TinyCached(core), crop_cache=lambda cache, length: None), PROMPT,
                 assistant_model=TinyRecompute(TinyCore(vocab=32, seed=1)), max_new_tokens=6)


def test_assistant_crop_hook_returning_none_is_an_error():
    core = _core()
    draft = ReturnsCache(TinyCached(TinyCore(vocab=32, seed=1)), crop_cache=lambda cache, length: None)
    with pytest.raises(TypeError, match=re.escape(
            "generate(): in the assistant model, rolling back rejected draft tokens: the crop_cache hook returned "
            "None")):
        generate(TinyRecompute(core), PROMPT, assistant_model=draft, max_new_tokens=8)


def test_returns_cache_model_returning_no_cache_is_an_error():
    def forgetful(input_ids, cache):  # an HF model called without use_cache=True returns past_key_values=None
        return torch.zeros(input_ids.shape[0], input_ids.shape[1], 8), None

    for options in (dict(), BEAMS, dict(prompt_lookup_num_tokens=2)):
        with pytest.raises(TypeError) as error:
            generate(ReturnsCache(forgetful), PROMPT, max_new_tokens=3, **{k: v for k, v in options.items()
                                                                            if k != "max_new_tokens"})
        assert str(error.value) == (
            "generate(): at step 0: a ReturnsCache model must return its cache, got (logits, None) after 4 tokens; "
            "return the cache it built (an HF model: pass use_cache=True), or use Recompute for a model without one.")


class _Forgetful(ModelAdapter):
    """A user adapter whose reorder_cache / crop forget to return the state."""

    def forward(self, input_ids, state):
        return self.model(input_ids)

    def reorder_cache(self, state, beam_idx):
        return None

    def crop(self, state, length):
        return None


def test_own_adapter_returning_no_state_is_an_error():
    with pytest.raises(TypeError, match=re.escape(
            "generate(): after step 0: _Forgetful.reorder_cache must return the state dict, got NoneType.")):
        generate(_Forgetful(TinyRecompute(_core())), PROMPT, **BEAMS)
    with pytest.raises(TypeError, match=re.escape("_Forgetful.crop must return the state dict, got NoneType.")):
        generate(_Forgetful(TinyRecompute(_core())), PROMPT, prompt_lookup_num_tokens=2, max_new_tokens=8)


def test_hooks_crop_state_returning_none_names_the_step():
    def prepare(input_ids, attention_mask, **state):
        return {"idx": input_ids}

    hooks = Hooks(TinyRecompute(_core()), prepare, crop_state=lambda state, length: None)
    with pytest.raises(TypeError, match=re.escape(
            "generate(): after step 0, rolling back rejected draft tokens: crop_state must return the state dict")):
        generate(hooks, PROMPT, assistant_model=TinyRecompute(TinyCore(vocab=32, seed=1)), max_new_tokens=6)


# ---- 2. Hooks with the cache under another key ----

def _cache_hooks(core, key="cache", **hooks):
    def prepare_inputs(input_ids, attention_mask, **state):
        cache = state.get(key)
        fed = 0 if cache is None else cache[0].shape[1]
        return {"idx": input_ids[:, fed:], "cache": cache, "attention_mask": attention_mask}

    def update_state(outputs, state):
        return {**state, key: outputs[1]}

    return Hooks(TinyCached(core), prepare_inputs, update_state, **hooks)


@pytest.mark.parametrize("key", ["cache", "kv", "past_key_values"])
def test_hooks_reorder_the_cache_under_any_key(key):
    core = _core()
    for options in (BEAMS, dict(max_new_tokens=5, num_beams=2, num_return_sequences=2),
                    dict(max_new_tokens=4, num_beams=2, do_sample=True)):
        torch.manual_seed(0)
        expected = _expected(core, **options)
        torch.manual_seed(0)
        assert torch.equal(generate(_cache_hooks(core, key), PROMPT, **options), expected)


def test_hooks_refuse_to_reorder_what_is_not_batch_first():
    core = _core()

    def prepare_inputs(input_ids, attention_mask, **state):
        stacked = state.get("stacked")
        cache = None if stacked is None else (stacked[0], stacked[1])
        fed = 0 if cache is None else cache[0].shape[1]
        return {"idx": input_ids[:, fed:], "cache": cache, "attention_mask": attention_mask}

    def update_state(outputs, state):
        return {**state, "stacked": torch.stack(outputs[1])}  # [2, B, T, D]: not batch-first

    with pytest.raises(CacheTypeError) as error:
        generate(Hooks(TinyCached(core), prepare_inputs, update_state), PROMPT, **BEAMS)
    assert str(error.value).startswith(
        "cannot reorder the cache for beam search: state['stacked'] is a tensor of shape (2, 3, 4, 16), but every "
        "tensor in a cache nest must have the batch (3) first.")
    assert "pass Hooks(..., reorder_state=lambda state, beam_idx: ...) for anything else" in str(error.value)


def test_hooks_carried_counter_and_inputs_are_kept():
    core = _core()
    seen = []

    def prepare_inputs(input_ids, attention_mask, scale, calls=0, **state):
        seen.append((calls, scale.shape))
        return {"idx": input_ids, "attention_mask": attention_mask}

    def update_state(outputs, state):
        return {**state, "calls": state.get("calls", 0) + 1}

    out = generate(Hooks(TinyMasked(core), prepare_inputs, update_state), PROMPT, scale=torch.ones(1, 3), **BEAMS)
    assert torch.equal(out, _expected(core, **BEAMS))
    assert [calls for calls, _ in seen] == list(range(5)) and seen[0][1] == (3, 3)


def test_hooks_crop_refuses_a_cache_under_another_key_before_a_wrong_token():
    core = _core()
    with pytest.raises(TypeError) as error:
        generate(_cache_hooks(core, "kv"), PROMPT, prompt_lookup_num_tokens=2, max_new_tokens=6)
    assert "this Hooks state carries `kv` (set by update_state), which hfbridge cannot roll back by itself (it " \
           "crops only `past_key_values`); pass Hooks(..., crop_state=lambda state, length: ...)" in str(error.value)


def test_hooks_crop_takes_the_cache_under_either_of_hfs_names():
    # `cache` is transformers' own name for it since 5.24: cropped like `past_key_values`, checked by its layout
    core = _core()
    options = dict(prompt_lookup_num_tokens=2, max_new_tokens=6)
    assert torch.equal(generate(_cache_hooks(core, "cache"), PROMPT, **options), _expected(core, **options))


def test_hooks_crop_of_a_cache_laid_out_another_way_is_named():
    core = _core()

    def prepare_inputs(input_ids, attention_mask, past_key_values=None):
        cache = None if past_key_values is None else tuple(t.transpose(1, 2) for t in past_key_values)
        fed = 0 if cache is None else cache[0].shape[1]
        return {"idx": input_ids[:, fed:], "cache": cache, "attention_mask": attention_mask}

    def update_state(outputs, state):  # stored as (batch, dim, seq): the sequence is the last axis
        return {**state, "past_key_values": tuple(t.transpose(1, 2) for t in outputs[1])}

    with pytest.raises(CacheTypeError, match=re.escape(
            "cannot drop positions from state['past_key_values'][0], a tensor of shape (1, 16, 10): hfbridge takes "
            "the second-to-last axis of a cache tensor as the sequence (HF's (batch, heads, seq, head_dim), or "
            "(batch, seq, dim)), while the model has seen 10 positions.")):
        generate(Hooks(TinyCached(core), prepare_inputs, update_state), torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]]),
                 prompt_lookup_num_tokens=2, max_new_tokens=6)


def test_hooks_crop_past_key_values_still_works():
    core = _core()
    prompt = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])
    plain = generate(TinyRecompute(core), prompt, max_new_tokens=6)
    assert torch.equal(generate(_cache_hooks(core, "past_key_values"), prompt, prompt_lookup_num_tokens=2,
                                max_new_tokens=6), plain)


# ---- 5. check_every with stateful user code ----

class Strict:
    """A stateful processor, as a grammar matcher: it fails when called again after the row's eos."""

    def __init__(self, eos):
        self.eos, self.done, self.calls = eos, False, 0

    def __call__(self, input_ids, scores):
        if self.done:
            raise RuntimeError("called after the end")
        self.calls += 1
        self.done = bool(input_ids[0, -1] == self.eos) if input_ids.shape[1] > 2 else False
        return scores


def _eos_model(vocab=10, eos=7, after=3):
    def model(input_ids):  # eos after `after` new tokens, else token 2
        logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], vocab)
        logits[..., 7 if input_ids.shape[1] >= 2 + after else 2] = 5.0
        return logits

    return model


@pytest.mark.parametrize("check_every", [1, 2, 4, 8])
def test_check_every_never_calls_user_processors_past_the_end(check_every):
    strict = Strict(eos=7)
    out = generate(_eos_model(), torch.tensor([[1, 1]]), max_new_tokens=12, eos_token_id=7, check_every=check_every,
                   processors=[strict])
    assert out.tolist() == [[1, 1, 2, 2, 2, 7]] and strict.calls == 4


def test_check_every_never_calls_user_criteria_or_prefix_fn_past_the_end():
    calls = []

    def allowed(batch_id, ids):
        calls.append(ids.shape[0])
        return list(range(10))

    out = generate(_eos_model(), torch.tensor([[1, 1]]), max_new_tokens=12, eos_token_id=7, check_every=4,
                   prefix_allowed_tokens_fn=allowed)
    assert out.shape[1] == 6 and calls == [2, 3, 4, 5]
    lengths = []

    def criterion(input_ids, scores, **kwargs):
        lengths.append(input_ids.shape[1])
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    generate(_eos_model(), torch.tensor([[1, 1]]), max_new_tokens=12, eos_token_id=7, check_every=4,
             stopping_criteria=[criterion])
    assert lengths == [3, 4, 5, 6]


def test_check_every_still_saves_reads_without_user_code():
    model = Counting()
    generate(model, torch.tensor([[1, 1]]), max_new_tokens=3, check_every=8)
    assert model.calls == 3


# ---- 6. an assistant with another vocabulary ----

@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("draft_vocab", [48, 24])
def test_assistant_with_another_vocabulary_is_refused(do_sample, draft_vocab):
    target, draft = TinyRecompute(TinyCore(vocab=32)), TinyRecompute(TinyCore(vocab=draft_vocab, seed=1))
    for model in (target, ReturnsCache(TinyCached(target.masked.core))):
        with pytest.raises(ValueError, match=re.escape(
                f"generate(): the assistant's logits have {draft_vocab} vocabulary columns and the target's 32;")):
            generate(model, PROMPT, assistant_model=draft, max_new_tokens=4, do_sample=do_sample)


def test_assistant_with_padded_vocabulary_and_vocab_size_is_accepted():
    core = _core()

    def padded(input_ids):  # the same model, its vocabulary padded to 40
        logits = TinyRecompute(core)(input_ids)
        return torch.cat([logits, torch.full((*logits.shape[:2], 8), -1e4)], dim=-1)

    expected = generate(TinyRecompute(core), PROMPT, max_new_tokens=6)
    assert torch.equal(generate(TinyRecompute(core), PROMPT, assistant_model=padded, max_new_tokens=6, vocab_size=32),
                       expected)


# ---- 7. the options of beams and drafts ----

@pytest.mark.parametrize("options, kind, text", [
    (dict(num_beams=2, length_penalty="2"), TypeError, "`length_penalty` must be a number, got str '2'."),
    (dict(num_beams=2, length_penalty=float("nan")), ValueError, "`length_penalty` must be a finite number, got nan."),
    (dict(num_beams=2, length_penalty=float("inf")), ValueError, "`length_penalty` must be a finite number, got inf."),
    (dict(num_beams=2, length_penalty=True), TypeError, "`length_penalty` must be a number, got bool True."),
    (dict(num_beams=2, early_stopping="yes"), TypeError, "`early_stopping` must be True, False or \"never\", got str "
                                                          "'yes'."),
    (dict(num_beams=2, early_stopping=1), TypeError, "`early_stopping` must be True, False or \"never\", got int 1."),
    (dict(num_beams=2, low_memory="no"), TypeError, "`low_memory` must be a bool (True or False), got str 'no'."),
    (dict(num_beams=2.0), TypeError, "`num_beams` must be an int >= 1, got float 2.0."),
    (dict(num_beams=True), TypeError, "`num_beams` must be an int >= 1, got bool True."),
    (dict(assistant_model="draft", num_assistant_tokens=float("inf")), ValueError,
     "`num_assistant_tokens` must be a finite number, got inf."),
    (dict(assistant_model="draft", num_assistant_tokens="5"), TypeError,
     "`num_assistant_tokens` must be a number, got str '5'."),
    (dict(assistant_model="draft", num_assistant_tokens=0.5), ValueError,
     "`num_assistant_tokens` must be a number >= 1, got 0.5."),
    (dict(assistant_model="draft", assistant_confidence_threshold=float("nan")), ValueError,
     "`assistant_confidence_threshold` must be a finite number, got nan."),
    (dict(assistant_model="draft", assistant_confidence_threshold=True), TypeError,
     "`assistant_confidence_threshold` must be a number, got bool True."),
    (dict(assistant_model="draft", assistant_confidence_threshold=-0.1), ValueError,
     "`assistant_confidence_threshold` must be a number in [0, 1], got -0.1."),
    (dict(assistant_model="draft", num_assistant_tokens_schedule=1), TypeError,
     "`num_assistant_tokens_schedule` must be one of ['constant', 'heuristic', 'heuristic_transient'], got int 1."),
    (dict(prompt_lookup_num_tokens=2.0), TypeError, "`prompt_lookup_num_tokens` must be an int >= 1, got float 2.0."),
    (dict(prompt_lookup_num_tokens=2, max_matching_ngram_size="2"), TypeError,
     "`max_matching_ngram_size` must be an int >= 1, got str '2'."),
])
def test_strategy_options_checked_before_any_model_call(options, kind, text):
    model, draft = Counting(), Counting()
    if options.get("assistant_model") == "draft":
        options = {**options, "assistant_model": draft}
    with pytest.raises(kind) as error:
        generate(model, torch.tensor([[1, 2]]), max_new_tokens=3, **options)
    assert str(error.value) == text
    assert model.calls == draft.calls == 0


@pytest.mark.parametrize("field, value, text", [
    ("length_penalty", float("nan"), "`length_penalty` must be a finite number, got nan."),
    ("length_penalty", "2", "`length_penalty` must be a number, got str '2'."),
    ("num_assistant_tokens", float("inf"), "`num_assistant_tokens` must be a finite number, got inf."),
])
def test_strategy_options_inside_a_generation_config(field, value, text):
    config = GenerationConfig(num_beams=2) if field == "length_penalty" else GenerationConfig()
    setattr(config, field, value)
    model, draft = Counting(), Counting()
    extra = {} if field == "length_penalty" else {"assistant_model": draft}
    with pytest.raises((TypeError, ValueError)) as error:
        generate(model, torch.tensor([[1, 2]]), generation_config=config, max_new_tokens=3, **extra)
    assert str(error.value) == text[:-1] + " (in `generation_config`)." and model.calls == draft.calls == 0


def test_valid_length_penalties_give_hf_beams():
    core = _core()
    for penalty in (-1.0, 0, 2):
        out = generate(TinyRecompute(core), PROMPT, length_penalty=penalty, num_beams=3, max_new_tokens=4,
                       eos_token_id=5, pad_token_id=0)
        assert out.shape[0] == 1


# ---- 8. prefix_allowed_tokens_fn returning bad values ----

@pytest.mark.parametrize("answer, kind, text", [
    ([1, 12], ValueError, "returned token id 12 for row {row} (batch_id {batch}), outside the vocabulary of 10 tokens "
                          "(ids 0 to 9)."),
    ([-1], ValueError, "returned token id -1 for row {row} (batch_id {batch}), outside the vocabulary of 10 tokens "
                       "(ids 0 to 9)."),
    (None, TypeError, "returned NoneType for row {row} (batch_id {batch}); expected the allowed token ids, a list of "
                      "ints (return [] only for a row that can never go on)."),
    (3, TypeError, "returned int for row {row} (batch_id {batch}); expected the allowed token ids, a list of ints "
                   "(return [] only for a row that can never go on)."),
    ([True, False], TypeError, "returned a list holding bool True for row {row} (batch_id {batch}); expected the "
                               "allowed token ids as ints."),
    ([1.0], TypeError, "returned a list holding float 1.0 for row {row} (batch_id {batch}); expected the allowed "
                       "token ids as ints."),
    (torch.tensor([1.0]), TypeError, "returned a tensor of shape (1,) and dtype torch.float32 for row {row} "
                                     "(batch_id {batch}); expected the allowed token ids, a list of ints (or a 1-d "
                                     "integer tensor)."),
    (torch.tensor([[1]]), TypeError, "returned a tensor of shape (1, 1) and dtype torch.int64 for row {row} "
                                     "(batch_id {batch}); expected the allowed token ids, a list of ints (or a 1-d "
                                     "integer tensor)."),
])
@pytest.mark.parametrize("strategy", [dict(), dict(do_sample=True), dict(num_beams=2), dict(prompt_lookup_num_tokens=2)])
def test_prefix_allowed_tokens_fn_answers_are_checked(answer, kind, text, strategy):
    def allowed(batch_id, input_ids):
        return answer if batch_id == (1 if "num_beams" in strategy else 0) and input_ids.shape[0] > 2 else [2, 3]

    model = Counting()
    prompts = torch.tensor([[1, 2]]) if "prompt_lookup_num_tokens" in strategy else torch.tensor([[1, 2], [2, 1]])
    row, batch = (2, 1) if "num_beams" in strategy else (0, 0)
    with pytest.raises(kind) as error:
        generate(model, prompts, max_new_tokens=4, prefix_allowed_tokens_fn=allowed, **strategy)
    assert str(error.value) == "generate(): at step 1: prefix_allowed_tokens_fn (allowed) " + text.format(
        row=row, batch=batch)


def test_prefix_allowed_tokens_fn_good_answers_as_hf():
    from transformers import PrefixConstrainedLogitsProcessor

    from hfbridge import build_processors, sample_step

    scores = torch.randn(2, 10, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[1, 2], [3, 4]])
    for answer in ([4, 5], (4, 5), range(4, 6), torch.tensor([4, 5])):
        def allowed(batch_id, input_ids, answer=answer):
            return answer

        hf = PrefixConstrainedLogitsProcessor(allowed, 1)(ids, scores.clone())
        ours = build_processors(prefix_allowed_tokens_fn=allowed)(ids, scores.clone())
        assert torch.equal(hf, ours)
        assert sample_step(scores, ids, prefix_allowed_tokens_fn=allowed).tolist() == hf.argmax(-1).tolist()
    assert type(build_processors(prefix_allowed_tokens_fn=allowed)[0]).__name__ == "PrefixConstrainedLogitsProcessor"
    with pytest.raises(ValueError, match="returned token id 10 for row 1 .batch_id 1."):
        sample_step(scores, ids, prefix_allowed_tokens_fn=lambda batch_id, input_ids: [batch_id * 10])
    with pytest.raises(ValueError, match="returned token id 10 for row 1 .batch_id 1."):
        explain_step(scores, ids, prefix_allowed_tokens_fn=lambda batch_id, input_ids: [batch_id * 10])


# ---- 9. compute_transition_scores ----

def _sampled():
    return generate(Counting(), torch.tensor([[1, 2], [3, 4]]), max_new_tokens=3, do_sample=True,
                    return_dict_in_generate=True, output_scores=True, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("token", [10, 25, -1])
def test_transition_scores_refuse_a_token_outside_the_vocabulary(token):
    out = _sampled()
    sequences = out.sequences.clone()
    sequences[0, 3] = token
    with pytest.raises(ValueError) as error:
        compute_transition_scores(sequences, out.scores)
    assert str(error.value) == (
        f"`sequences` row 0 holds token id {token} at generated position 1, outside the 10 vocabulary columns of "
        "`scores`; pass the sequences and scores of the same generate() output (a pad_token_id outside the "
        "vocabulary cannot be scored either).")


def test_transition_scores_beam_indices_checked():
    out = generate(Counting(), torch.tensor([[1, 2]]), max_new_tokens=3, num_beams=2, return_dict_in_generate=True,
                   output_scores=True)
    good = compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    assert good.shape == (1, 3) and torch.isfinite(good).all()
    longer = torch.cat([out.beam_indices, out.beam_indices[:, :2]], dim=1)
    with pytest.raises(ValueError) as error:
        compute_transition_scores(out.sequences, out.scores, longer)
    assert str(error.value) == ("`beam_indices` follow beams for 5 tokens, but `scores` has 3 steps; pass the "
                                "beam_indices and scores of the same generate() output.")
    sequences = out.sequences.clone()
    sequences[0, -1] = 99
    with pytest.raises(ValueError, match="`sequences` row 0 holds token id 99 at generated position 2"):
        compute_transition_scores(sequences, out.scores, out.beam_indices)
    # transformers 4.x pads beam_indices with -1 up to max_length: those columns are not scored
    padded = torch.cat([out.beam_indices, torch.full((1, 2), -1, dtype=out.beam_indices.dtype)], dim=1)
    assert torch.equal(compute_transition_scores(out.sequences, out.scores, padded)[:, :3], good)


# ---- 3. explain_generation when pad equals eos ----

def _output(tokens, prompt=(1,)):
    rows = torch.tensor([list(prompt) + row for row in tokens])
    scores = tuple(torch.zeros(len(tokens), 10) for _ in range(len(tokens[0])))
    return GenerateDecoderOnlyOutput(sequences=rows, scores=scores)


@pytest.mark.parametrize("tokens, flags", [
    ([[4, 5, 0]], [False, False, False]),  # the eos that ends the longest row
    ([[4, 0, 0]], [False, False, True]),  # one real eos, then its filler
    ([[0, 0, 0]], [False, True, True]),
    ([[4, 0, 5, 0, 0]], [False, False, False, False, True]),  # an eos that did not stop the row
])
def test_pad_equal_to_eos_keeps_the_real_eos(tokens, flags):
    out = _output(tokens)
    trace = explain_generation(out, eos_token_id=0, pad_token_id=0)
    assert [s.padding for s in trace.steps] == flags
    assert [s.token for s in trace.generated] == [t for t, f in zip(tokens[0], flags) if not f]


def test_pad_equal_to_eos_in_a_batch_from_generate():
    model = _eos_model(after=3)

    def uneven(input_ids):  # row 0 ends after 3 tokens, row 1 after 5
        logits = torch.zeros(input_ids.shape[0], input_ids.shape[1], 10)
        logits[..., 2] = 5.0
        ends = torch.tensor([3, 5])[:, None] + 2 <= input_ids.shape[1]
        logits[..., 7] = torch.where(ends, 9.0, 0.0)
        return logits

    del model
    out = generate(uneven, torch.tensor([[1, 1], [1, 1]]), max_new_tokens=8, eos_token_id=7, pad_token_id=7,
                   return_dict_in_generate=True, output_scores=True)
    assert out.sequences[:, 2:].tolist() == [[2, 2, 2, 7, 7, 7], [2, 2, 2, 2, 2, 7]]
    for row, generated in ((0, 4), (1, 6)):
        trace = explain_generation(out, row=row, eos_token_id=7, pad_token_id=7)
        assert len(trace.generated) == generated and trace.generated[-1].token == 7


def test_pad_equal_to_eos_with_a_tokenizer():
    tok = char_tokenizer()
    tok.pad_token = tok.eos_token  # GPT-2's usual setup
    a, b = tok.convert_tokens_to_ids(["a", "b"])
    out = _output([[a, b, 0], [a, 0, 0]])
    assert explain_generation(out, tok).text == "ab<eos>"
    trace = explain_generation(out, tok, row=1)
    assert trace.text == "a<eos>" and "1 padding" in str(trace)


# ---- 10. a tokenizer name instead of a tokenizer ----

def test_tokenizer_name_is_refused_with_what_was_expected():
    message = ("`tokenizer` must be a tokenizer object with a .decode method, got str 'gpt2'; load it first: "
               "AutoTokenizer.from_pretrained('gpt2').")
    with pytest.raises(TypeError) as error:
        explain_generation(_output([[1, 2]]), "gpt2")
    assert str(error.value) == message
    with pytest.raises(TypeError) as error:
        explain_step(torch.zeros(1, 4), tokenizer="gpt2")
    assert str(error.value) == message
    model = Counting()
    with pytest.raises(TypeError) as error:
        generate(model, torch.tensor([[1, 2]]), max_new_tokens=2, tokenizer="gpt2", stop_strings=["a"])
    assert str(error.value) == message and model.calls == 0
    with pytest.raises(TypeError, match=re.escape("got int 3 (a transformers tokenizer, e.g. "
                                                  "AutoTokenizer.from_pretrained(...)).")):
        explain_generation(_output([[1, 2]]), 3)


def test_nothing_here_is_nan_or_silent():
    # the trace of a valid output stays finite: a guard that the checks above changed no result
    trace = explain_generation(_sampled())
    assert all(math.isfinite(s.prob) for s in trace.steps)
    assert isinstance(Recompute(Counting()), ModelAdapter)
