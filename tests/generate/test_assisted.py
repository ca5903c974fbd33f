"""Assisted decoding, prompt-lookup decoding and `prefix_allowed_tokens_fn`, against HF's own.

Tiny random `GPT2LMHeadModel` / `LlamaForCausalLM` (tests/_tiny_models.py) are called through the
recompute form and the KV-cache forms, and compared with `model.generate` on the same options and
the same `torch.manual_seed`.
"""

from __future__ import annotations

import collections
import copy
import re

import pytest
import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor

from hfbridge import (
    Hooks,
    InputPos,
    ModelAdapter,
    Recompute,
    ReturnsCache,
    Sampler,
    build_processors,
    generate,
    sample_step,
)
from hfbridge._models.cache import CacheTypeError, crop_cache

from _tiny_models import (
    HF_MODELS,
    TinyCached,
    TinyCore,
    TinyFast,
    TinyRecompute,
    model_cache,
    positions,
    recompute_callable,
    returns_cache_callable,
)

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

_model = model_cache()


# ------------------------------------------------------------------------------------------
# prefix_allowed_tokens_fn
# ------------------------------------------------------------------------------------------


def _even_after_odd(batch_id, input_ids):
    """Row 0: after an odd token only even ones; row 1: only tokens 20..29. Depends on the row and its tokens."""
    if batch_id == 1:
        return list(range(20, 30))
    return list(range(0, 48, 2)) if int(input_ids[-1]) % 2 else list(range(48))


PADDED = (torch.tensor([[5, 9, 13, 2, 7, 21], [0, 0, 0, 3, 4, 11]]), torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]]))
FORMS = {  # name -> (adapter factory, HF's use_cache)
    "recompute": (lambda hf: Recompute(recompute_callable(hf)), False),
    "returns_cache": (lambda hf: ReturnsCache(returns_cache_callable(hf)), True),
}


@pytest.mark.parametrize("model_name", list(HF_MODELS))
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("options", [dict(do_sample=False), dict(do_sample=True, top_k=10, temperature=1.3)],
                         ids=["greedy", "sample"])
def test_prefix_allowed_tokens_fn_matches_hf(model_name, form, options):
    hf = _model(model_name)
    make_adapter, use_cache = FORMS[form]
    prompt, mask = PADDED
    torch.manual_seed(7)
    theirs = hf.generate(prompt, attention_mask=mask, use_cache=use_cache, max_new_tokens=8,
                         prefix_allowed_tokens_fn=_even_after_odd, **options)
    torch.manual_seed(7)
    ours = generate(make_adapter(hf), prompt, attention_mask=mask, max_new_tokens=8,
                    prefix_allowed_tokens_fn=_even_after_odd, **options)
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"
    new = ours[:, prompt.shape[1]:]
    assert bool(((new[1] >= 20) & (new[1] < 30)).all())  # the constraint really acted
    previous = ours[0, prompt.shape[1] - 1:-1]
    assert bool((new[0][previous % 2 == 1] % 2 == 0).all())


def test_prefix_allowed_tokens_fn_in_the_step_api():
    """Sampler, sample_step and build_processors build HF's processor where HF puts it, and apply it."""
    processors = build_processors(prefix_allowed_tokens_fn=_even_after_odd, repetition_penalty=1.2)
    assert [type(p).__name__ for p in processors] == ["RepetitionPenaltyLogitsProcessor",
                                                      "PrefixConstrainedLogitsProcessor"]
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 48)
    ids = torch.tensor([[4, 7, 9], [1, 2, 3]])
    expected = PrefixConstrainedLogitsProcessor(_even_after_odd, 1)(ids, logits[:, -1].clone()).argmax(-1)
    assert sample_step(logits, ids, prefix_allowed_tokens_fn=_even_after_odd).tolist() == expected.tolist()
    sampler = Sampler(prefix_allowed_tokens_fn=_even_after_odd)
    assert sampler(logits, ids).tolist() == expected.tolist()
    assert expected[0] % 2 == 0 and 20 <= expected[1] < 30


def test_prefix_allowed_tokens_fn_errors():
    model = Recompute(lambda ids: torch.zeros(ids.shape[0], ids.shape[1], 8))
    calls = []
    with pytest.raises(TypeError, match=r"`prefix_allowed_tokens_fn` must be callable as "
                                        r"prefix_allowed_tokens_fn\(batch_id, input_ids\).*got list"):
        generate(lambda ids: calls.append(1), torch.tensor([[1, 2]]), prefix_allowed_tokens_fn=[1, 2])
    assert calls == []  # refused before the first model call
    with pytest.raises(TypeError, match="must be callable"):
        sample_step(torch.zeros(1, 8), prefix_allowed_tokens_fn="abc")
    with pytest.raises(ValueError, match="returned an empty list for batch ID 0") as error:
        generate(model, torch.tensor([[1, 2]]), max_new_tokens=2, prefix_allowed_tokens_fn=lambda b, ids: [])
    assert "raised by the logits processors at step 0" in "".join(getattr(error.value, "__notes__", []))


def test_prefix_allowed_tokens_fn_merges_with_processors():
    """A user processor list and the constraint together, as HF's `_get_logits_processor` merges them."""
    def boost(input_ids, scores):
        return scores + torch.arange(scores.shape[-1], dtype=scores.dtype)

    processors = build_processors(processors=LogitsProcessorList([boost]), prefix_allowed_tokens_fn=_even_after_odd)
    assert [getattr(p, "__name__", type(p).__name__) for p in processors] == [
        "PrefixConstrainedLogitsProcessor", "boost"]


# ------------------------------------------------------------------------------------------
# Assisted and prompt-lookup decoding: the model forms
# ------------------------------------------------------------------------------------------


def all_logits_recompute(hf):
    """`model(input_ids, attention_mask) -> logits` of every position (the target checks several at once)."""
    def model(input_ids, attention_mask):
        return hf(input_ids, attention_mask=attention_mask, position_ids=positions(attention_mask),
                  use_cache=False).logits

    return model


def all_logits_cached(hf):
    """`model(input_ids, cache, attention_mask) -> (logits, cache)`: an HF `DynamicCache`, or in transformers
    4.46 the legacy tuple of `(key, value)` tensors `[B, H, T, D]` (cropped as a tensor nest)."""
    def model(input_ids, cache, attention_mask):
        position_ids = positions(attention_mask)[:, -input_ids.shape[1]:]
        out = hf(input_ids, past_key_values=cache, attention_mask=attention_mask, position_ids=position_ids,
                 use_cache=True)
        return out.logits, out.past_key_values

    return model


class InputPosRollback(torch.nn.Module):
    """gpt-fast's contract on an HF model: a call at positions `input_pos` replaces what was stored there."""

    def __init__(self, hf):
        super().__init__()
        self.hf, self.cache = hf, None

    def forward(self, idx, input_pos):
        start = int(input_pos[0])
        self.cache = None if start == 0 else crop_cache(self.cache, start)
        out = self.hf(idx, past_key_values=self.cache, position_ids=input_pos[None].expand(idx.shape[0], -1),
                      use_cache=True)
        self.cache = out.past_key_values
        return out.logits


def _cache_length(cache):
    return cache.get_seq_length() if hasattr(cache, "get_seq_length") else cache[0][0].shape[-2]


def hooks_form(hf):
    """HF's own calling convention through `Hooks`: the cache lives in `state["past_key_values"]`."""
    def prepare_inputs(input_ids, attention_mask, past_key_values=None, **state):
        seen = 0 if past_key_values is None else _cache_length(past_key_values)
        return {"input_ids": input_ids[:, seen:], "attention_mask": attention_mask, "use_cache": True,
                "position_ids": positions(attention_mask)[:, seen:], "past_key_values": past_key_values}

    def update_state(outputs, state):
        return {**state, "past_key_values": outputs.past_key_values}

    return Hooks(hf, prepare_inputs, update_state)


ASSISTED_FORMS = {
    "recompute": lambda hf: Recompute(all_logits_recompute(hf)),
    "returns_cache": lambda hf: ReturnsCache(all_logits_cached(hf)),
    "input_pos": lambda hf: InputPos(InputPosRollback(hf)),
    "hooks": hooks_form,
}
PROMPT = torch.tensor([[5, 7, 9, 11, 5, 7, 9, 30]])
EOS = [0, 13, 26, 39]
ASSISTED_CONFIGS = {
    "greedy": dict(do_sample=False),
    "sample": dict(do_sample=True),
    "sample_processors": dict(do_sample=True, top_p=0.9, temperature=0.8, repetition_penalty=1.2),
    "greedy_eos_min_new": dict(do_sample=False, eos_token_id=EOS, pad_token_id=1, min_new_tokens=4,
                               no_repeat_ngram_size=2),
    "sample_eos_dict": dict(do_sample=True, top_k=12, eos_token_id=EOS, pad_token_id=1, return_dict_in_generate=True,
                            output_scores=True, output_logits=True),
}
DRAFTS = {  # the assistant's own options in HF (its generation_config)
    "defaults": {},
    "long_drafts": dict(num_assistant_tokens=4, assistant_confidence_threshold=0.0),
    "heuristic": dict(num_assistant_tokens=3, num_assistant_tokens_schedule="heuristic",
                      assistant_confidence_threshold=0.0),
}


def _hf_assisted(target, assistant, options, draft, seed):
    # HF writes into the assistant's generation_config (eos in 4.46, the heuristic's draft length): restore it
    saved = copy.deepcopy(assistant.generation_config)
    assistant.generation_config.update(**draft)
    try:
        torch.manual_seed(seed)
        return target.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), assistant_model=assistant,
                               max_new_tokens=14, **options)
    finally:
        assistant.generation_config = saved


def _assert_same(ours, theirs):
    if isinstance(theirs, torch.Tensor):
        assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"
        return
    assert type(ours) is type(theirs)
    assert torch.equal(ours.sequences, theirs.sequences), f"\nhfbridge:\n{ours.sequences}\nHF:\n{theirs.sequences}"
    for field in ("scores", "logits"):
        mine, hf = getattr(ours, field), getattr(theirs, field)
        assert len(mine) == len(hf), field
        for a, b in zip(mine, hf):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


# Every config through both main forms; the draft schedules, and the gpt-fast and Hooks forms, on a few.
ASSISTED_CASES = (
    [(config, "long_drafts", form) for config in ASSISTED_CONFIGS for form in ("recompute", "returns_cache")]
    + [(config, draft, "returns_cache") for config in ("greedy", "sample_processors") for draft in ("defaults", "heuristic")]
    + [(config, "long_drafts", form) for config in ("greedy_eos_min_new", "sample_eos_dict") for form in ("input_pos", "hooks")]
)


@pytest.mark.parametrize(("config", "draft", "form"), ASSISTED_CASES, ids=["-".join(case) for case in ASSISTED_CASES])
def test_assisted_matches_hf(config, draft, form):
    target, assistant = _model("gpt2"), _model("llama")
    options, draft_options = ASSISTED_CONFIGS[config], DRAFTS[draft]
    make = ASSISTED_FORMS[form]
    try:
        theirs = _hf_assisted(target, assistant, options, draft_options, seed=3)
    except ValueError as refused:  # e.g. 4.57's candidate generator refuses min_length with eos: so must we
        with pytest.raises(ValueError, match=re.escape(str(refused))):
            generate(make(target), PROMPT, assistant_model=make(assistant), max_new_tokens=14,
                     **draft_options, **options)
        return
    except RuntimeError:  # 5.15's own assisted loop calls its assistant with no new token: we must raise too
        with pytest.raises(RuntimeError):  # HF's error, or TransformersContractError (a RuntimeError)
            generate(make(target), PROMPT, assistant_model=make(assistant), max_new_tokens=14,
                     **draft_options, **options)
        return
    prompt_before = PROMPT.clone()
    torch.manual_seed(3)
    ours = generate(make(target), PROMPT, assistant_model=make(assistant), max_new_tokens=14,
                    **draft_options, **options)
    _assert_same(ours, theirs)
    assert torch.equal(PROMPT, prompt_before)
    if not options["do_sample"]:  # greedy: the assistant changes the cost, never the tokens
        torch.manual_seed(3)
        plain = generate(make(target), PROMPT, max_new_tokens=14, **options)
        assert torch.equal(ours, plain)


@pytest.mark.parametrize("roles", [("llama", "gpt2"), ("gpt2", "gpt2")], ids=["llama_drafted_by_gpt2", "self_draft"])
def test_assisted_other_pairs_match_hf(roles):
    target, assistant = _model(roles[0]), _model(roles[1])
    draft = DRAFTS["long_drafts"]
    for options in (ASSISTED_CONFIGS["greedy"], ASSISTED_CONFIGS["sample_processors"]):
        theirs = _hf_assisted(target, assistant, options, draft, seed=11)
        torch.manual_seed(11)
        ours = generate(ASSISTED_FORMS["returns_cache"](target), PROMPT,
                        assistant_model=ASSISTED_FORMS["recompute"](assistant), max_new_tokens=14, **draft, **options)
        _assert_same(ours, theirs)


LOOKUP_PROMPT = torch.tensor([[3, 8, 21, 4, 3, 8, 21, 4, 3, 8]])


LOOKUP_OPTIONS = {"greedy": dict(do_sample=False), "sample": dict(do_sample=True, top_k=20),
                  "penalty_ngram3": dict(do_sample=False, repetition_penalty=1.3, max_matching_ngram_size=3)}
LOOKUP_CASES = [(name, form) for name in LOOKUP_OPTIONS for form in ASSISTED_FORMS
                if form in ("recompute", "returns_cache") or name == "penalty_ngram3"]


@pytest.mark.parametrize(("options", "form"), LOOKUP_CASES, ids=["-".join(case) for case in LOOKUP_CASES])
def test_prompt_lookup_matches_hf(options, form):
    options = LOOKUP_OPTIONS[options]
    target = _model("llama")
    mask = torch.ones_like(LOOKUP_PROMPT)
    eos = dict(eos_token_id=47, pad_token_id=1)  # transformers 4.46's lookup needs an eos id
    torch.manual_seed(5)
    theirs = target.generate(LOOKUP_PROMPT, attention_mask=mask, prompt_lookup_num_tokens=4, max_new_tokens=12,
                             **eos, **options)
    torch.manual_seed(5)
    ours = generate(ASSISTED_FORMS[form](target), LOOKUP_PROMPT, prompt_lookup_num_tokens=4, max_new_tokens=12,
                    **eos, **options)
    _assert_same(ours, theirs)
    if not options["do_sample"]:
        plain = generate(ASSISTED_FORMS[form](target), LOOKUP_PROMPT, max_new_tokens=12, **eos, **options)
        assert torch.equal(ours, plain)


# ------------------------------------------------------------------------------------------
# The target really runs fewer times when the draft is good
# ------------------------------------------------------------------------------------------

COUNT_VOCAB = 16


class Successor:
    """A perfectly predictable model: after token t comes t + 1 (mod 16), with certainty. Counts its calls."""

    def __init__(self):
        self.calls = 0

    def logits(self, input_ids):  # [B, T] -> [B, T, V]
        self.calls += 1
        return 20.0 * torch.nn.functional.one_hot((input_ids + 1) % COUNT_VOCAB, COUNT_VOCAB).float()

    def __call__(self, input_ids):
        return self.logits(input_ids)


class SuccessorCached(Successor):
    """The same as `model(input_ids, cache) -> (logits, cache)`; the cache `[B, T, 1]` holds the tokens
    fed so far, and every call checks that it is exactly the sequence before the new tokens."""

    def __init__(self):
        super().__init__()
        self.history = None

    def __call__(self, input_ids, cache):
        fed = input_ids[..., None].float()  # [B, S, 1]
        cache = fed if cache is None else torch.cat([cache, fed], dim=1)
        return self.logits(input_ids), cache


def test_assisted_calls_the_target_once_per_accepted_draft():
    prompt = torch.tensor([[3, 4, 5]])
    plain_model = Successor()
    plain = generate(plain_model, prompt, max_new_tokens=20)
    assert plain_model.calls == 20
    for target in (Successor(), SuccessorCached()):
        make = Recompute if type(target) is Successor else ReturnsCache
        draft = Successor()
        out = generate(make(target), prompt, assistant_model=draft, max_new_tokens=20, num_assistant_tokens=4,
                       return_dict_in_generate=True)
        assert torch.equal(out.sequences, plain)
        assert target.calls == 4  # 4 drafts + 1 token of its own per call: 20 tokens in 4 calls
        assert draft.calls == 16  # the draft still runs once per drafted token
        if make is ReturnsCache:  # the cache holds every token fed: the sequence without its last token
            assert torch.equal(out.past_key_values[0, :, 0].long(), out.sequences[0, :-1])


def test_assisted_rejected_drafts_are_rolled_back():
    """A draft that is wrong every third token: the target rejects, crops its cache, and still gives greedy."""
    class Sloppy(Successor):
        def logits(self, input_ids):
            logits = super().logits(input_ids)
            wrong = (input_ids % 3 == 0)[..., None]
            return torch.where(wrong, logits.roll(1, dims=-1), logits)

    prompt = torch.tensor([[1, 2]])
    plain = generate(Successor(), prompt, max_new_tokens=15)
    target = SuccessorCached()
    out = generate(ReturnsCache(target), prompt, assistant_model=Sloppy(), max_new_tokens=15,
                   num_assistant_tokens=5, return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain)
    assert torch.equal(out.past_key_values[0, :, 0].long(), out.sequences[0, :-1])
    assert 3 < target.calls < 15


def test_prompt_lookup_calls_the_target_less_when_the_prompt_holds_the_continuation():
    prompt = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 1, 2]])  # after "1 2" the prompt says "3 4 5 6 7 8"
    plain_model = Successor()
    plain = generate(plain_model, prompt, max_new_tokens=7)
    assert plain_model.calls == 7
    for target, make in ((Successor(), Recompute), (SuccessorCached(), ReturnsCache)):
        out = generate(make(target), prompt, prompt_lookup_num_tokens=10, max_new_tokens=7)
        assert torch.equal(out, plain)
        assert target.calls == 1  # 3..8 from the prompt, all accepted, and 9 from the same call


def test_custom_models_assisted_equal_their_greedy():
    """Non-HF models: a tuple-of-tensors cache `[B, T, D]` and a gpt-fast static cache, drafted by a recompute one."""
    core, draft_core = TinyCore(seed=0), TinyCore(seed=1)
    prompt = torch.tensor([[3, 9, 4, 1, 7]])
    plain = generate(TinyRecompute(core), prompt, max_new_tokens=12)
    cached = generate(ReturnsCache(TinyCached(core)), prompt, assistant_model=TinyRecompute(draft_core),
                      max_new_tokens=12, num_assistant_tokens=3, assistant_confidence_threshold=0.0)
    assert torch.equal(cached, plain)
    fast = TinyFast(core)
    fast.setup_caches(1, 64)
    draft = TinyFast(core)  # a perfect draft, in the gpt-fast form too
    draft.setup_caches(1, 64)
    out = generate(InputPos(fast), prompt, assistant_model=InputPos(draft), max_new_tokens=12,
                   num_assistant_tokens=3, assistant_confidence_threshold=0.0)
    assert torch.equal(out, plain)
    assert len(fast.calls) < 12
    looked_up = generate(InputPos(fast), prompt, prompt_lookup_num_tokens=3, max_new_tokens=12)
    assert torch.equal(looked_up, plain)


# ------------------------------------------------------------------------------------------
# crop_cache
# ------------------------------------------------------------------------------------------


def test_crop_cache_nests_and_hf_caches():
    k = torch.arange(2 * 3 * 6 * 4, dtype=torch.float).view(2, 3, 6, 4)  # [B, H, T, D]
    Pair = collections.namedtuple("Pair", "key value")
    nest = {"layers": [Pair(k, k + 1), (k[:, 0], k[:, 0])], "empty": None}
    before = k.clone()
    cropped = crop_cache(nest, 4, cached=6)
    assert isinstance(cropped["layers"][0], Pair) and isinstance(cropped["layers"][1], tuple)
    assert torch.equal(cropped["layers"][0].value, (k + 1)[:, :, :4]) and cropped["empty"] is None
    assert cropped["layers"][1][0].shape == (2, 4, 4)  # [B, T, D]: the sequence is second to last too
    assert torch.equal(k, before)  # views; nothing written
    hf_cache = _model("llama")(torch.tensor([[1, 2, 3, 4, 5]]), use_cache=True).past_key_values
    if isinstance(hf_cache, tuple):  # transformers 4.46 returns the legacy format
        assert crop_cache(hf_cache, 3)[0][0].shape[-2] == 3
    else:
        assert crop_cache(hf_cache, 3) is hf_cache and hf_cache.get_seq_length() == 3
        crop_cache(hf_cache, 3)
        assert hf_cache.get_seq_length() == 3


def test_crop_cache_errors():
    with pytest.raises(CacheTypeError, match=r"cache\[1\], a tensor of shape \(2, 6\).*second-to-last axis"):
        crop_cache((torch.zeros(2, 6, 4), torch.zeros(2, 6)), 3)
    with pytest.raises(CacheTypeError, match=r"shape \(2, 6, 4\).*while the model has seen 5 positions"):
        crop_cache(torch.zeros(2, 6, 4), 3, cached=5)
    with pytest.raises(CacheTypeError, match=r"cache\['state'\], a int.*ReturnsCache\(model, crop_cache=...\), Hooks\(crop_state"):
        crop_cache({"state": 3}, 1)
    with pytest.raises(ValueError, match="`length` must be an int >= 0"):
        crop_cache(None, -1)
    with pytest.raises(CacheTypeError, match=r"^cache\['kv'\].crop\(2\) returned None; it must return the cropped "
                                             r"cache\.$"):
        crop_cache({"kv": _CropsItself(None)}, 2)


class _CropsItself:
    """A cache object with its own `crop(length)` (as the demo model's `KVCache`)."""

    def __init__(self, result):
        self.result, self.lengths = result, []

    def crop(self, length):
        self.lengths.append(length)
        return self.result


def test_crop_cache_calls_a_caches_own_crop():
    cache = _CropsItself("cropped")
    assert crop_cache([cache], 3, cached=5) == ["cropped"] and cache.lengths == [3]


# ------------------------------------------------------------------------------------------
# Refusals, before the first model call
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("arguments", "error", "message"), [
    (dict(input_ids=torch.tensor([[1, 2], [3, 4]])), ValueError,
     r"assisted decoding takes one sequence \(batch size 1, as HF's\), got 2"),
    (dict(num_return_sequences=2, do_sample=True), ValueError, "got 2 .prompts x num_return_sequences"),
    (dict(do_sample=True, generator=torch.Generator()), ValueError, "samples from the global RNG"),
    (dict(fast=True, do_sample=True), ValueError, "`fast=True` is the one-token sampling path"),
    (dict(max_context=4), ValueError, "max_context=4 tokens would score with less context"),
    (dict(model_input=torch.ones(1)), TypeError, "`assistant_model`: generate.. got `model_input`.*as in HF"),
    (dict(prompt_lookup_num_tokens=3), ValueError, "were both given; HF would draft from the prompt and ignore"),
    (dict(assistant_tokenizer=object()), TypeError, "does not support `assistant_tokenizer`.*share the target's token"),
    (dict(num_assistant_tokens=0), ValueError, r"`num_assistant_tokens` must be a number >= 1, got 0"),
    (dict(num_assistant_tokens_schedule="fast"), ValueError, r"must be one of \['constant', 'heuristic', "),
    (dict(assistant_confidence_threshold=1.5), ValueError, r"`assistant_confidence_threshold` must be a number in"),
])
def test_assisted_refusals(arguments, error, message):
    target, draft = Successor(), Successor()

    def with_input(input_ids, model_input=None):
        return target(input_ids)

    arguments = {"input_ids": torch.tensor([[1, 2]]), **arguments}
    model = with_input if "model_input" in arguments else target
    with pytest.raises(error, match=message):
        generate(model, assistant_model=draft, max_new_tokens=3, **arguments)
    assert target.calls == draft.calls == 0


@pytest.mark.parametrize(("options", "error", "message"), [
    (dict(prompt_lookup_num_tokens=0), ValueError, r"`prompt_lookup_num_tokens` must be an int >= 1, got 0"),
    (dict(prompt_lookup_num_tokens=True), TypeError, r"`prompt_lookup_num_tokens` must be an int >= 1, got bool True"),
    (dict(prompt_lookup_num_tokens=2, max_matching_ngram_size=0), ValueError,
     r"`max_matching_ngram_size` must be an int >= 1"),
])
def test_prompt_lookup_refusals(options, error, message):
    target = Successor()
    with pytest.raises(error, match=message):
        generate(target, torch.tensor([[1, 2]]), max_new_tokens=3, **options)
    assert target.calls == 0


def test_assisted_other_misuse():
    core = TinyCore()
    fast = TinyFast(core)
    fast.setup_caches(1, 16)
    with pytest.raises(ValueError, match="the same InputPos model, whose one cache inside"):
        generate(InputPos(fast), torch.tensor([[1, 2]]), assistant_model=InputPos(fast), max_new_tokens=3)
    with pytest.raises(TypeError, match=r"`assistant_model`: `model` must be callable"):
        generate(Successor(), torch.tensor([[1, 2]]), assistant_model="draft", max_new_tokens=3)
    assert fast.calls == []

    def nan_draft(input_ids):
        return torch.full((1, input_ids.shape[1], COUNT_VOCAB), float("nan"))

    with pytest.raises(ValueError, match="NaN") as error:
        generate(Successor(), torch.tensor([[1, 2]]), assistant_model=nan_draft, max_new_tokens=3)
    assert "while the assistant model drafted after 2 tokens" in "".join(getattr(error.value, "__notes__", []))


def test_assisted_streams_every_token_and_handles_one_new_token():
    class Collect:
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value.tolist())

        def end(self):
            self.chunks.append("end")

    streamer = Collect()
    prompt = torch.tensor([[3, 4]])
    out = generate(Successor(), prompt, assistant_model=Successor(), max_new_tokens=9, num_assistant_tokens=3,
                   streamer=streamer)
    assert streamer.chunks[0] == [[3, 4]] and streamer.chunks[-1] == "end"
    assert sum(len(chunk[0]) if len(chunk) == 1 else len(chunk) for chunk in streamer.chunks[1:-1]) == 9
    assert out[0, 2:].tolist() == [5, 6, 7, 8, 9, 10, 11, 12, 13]
    one = generate(Successor(), prompt, assistant_model=Successor(), max_new_tokens=1)
    assert one.tolist() == [[3, 4, 5]]
    pytest.importorskip("tqdm")
    streamer = Collect()
    with_bar = generate(Successor(), prompt, assistant_model=Successor(), max_new_tokens=9, num_assistant_tokens=3,
                        streamer=streamer, progress=True)
    assert torch.equal(with_bar, out) and streamer.chunks[0] == [[3, 4]] and streamer.chunks[-1] == "end"


def test_assisted_refuses_adapters_that_cannot_roll_back():
    class Custom(ModelAdapter):
        def forward(self, input_ids, state):
            return self.model(input_ids)

    target = Successor()
    with pytest.raises(TypeError, match=r"`model`: Custom does not say how to drop positions.*override crop"):
        generate(Custom(target), torch.tensor([[1]]), prompt_lookup_num_tokens=2, max_new_tokens=3)
    with pytest.raises(TypeError, match=r"`assistant_model`: Custom does not say"):
        generate(target, torch.tensor([[1]]), assistant_model=Custom(Successor()), max_new_tokens=3)
    assert target.calls == 0
    hooks = Hooks(lambda input_ids: target(input_ids), lambda input_ids, **state: {"input_ids": input_ids})
    with pytest.raises(TypeError, match="no `past_key_values` entry to crop; pass Hooks.*crop_state"):
        generate(hooks, torch.tensor([[1, 2]]), assistant_model=Successor(), max_new_tokens=3)
    class Counted:  # a cache object hfbridge cannot crop: a custom hook does it
        def __init__(self, tokens):
            self.tokens = tokens

    def wrong_draft(input_ids):  # always proposes t + 2: every draft is rejected
        return Successor().logits(input_ids + 1)

    def counted(input_ids, cache):
        tokens = input_ids if cache is None else torch.cat([cache.tokens, input_ids], dim=1)
        return Successor().logits(input_ids), Counted(tokens)

    with pytest.raises(TypeError, match=r"cannot drop positions from cache, a Counted.*ReturnsCache\(model, crop_cache"):
        generate(ReturnsCache(counted), torch.tensor([[1, 2]]), assistant_model=wrong_draft, max_new_tokens=4)
    hooked = ReturnsCache(counted, crop_cache=lambda cache, length: Counted(cache.tokens[:, :length]))
    out = generate(hooked, torch.tensor([[1, 2]]), assistant_model=wrong_draft, max_new_tokens=6,
                   return_dict_in_generate=True)
    assert torch.equal(out.past_key_values.tokens, out.sequences[:, :-1])
    assert out.sequences.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    recompute_hooks = Hooks(lambda input_ids: target(input_ids), lambda input_ids, **state: {"input_ids": input_ids},
                            crop_state=lambda state, length: state)
    plain = generate(Successor(), torch.tensor([[1, 2]]), max_new_tokens=6)
    assert torch.equal(generate(recompute_hooks, torch.tensor([[1, 2]]), assistant_model=Successor(),
                                max_new_tokens=6), plain)


def test_assisted_needs_the_logits_of_every_fed_position():
    hf = _model("llama")  # recompute_callable asks HF for the last position only (logits_to_keep=1)
    with pytest.raises(ValueError, match=r"the target model returned logits of shape \(1, 1, 48\).*all 10 positions"):
        generate(recompute_callable(hf), PROMPT, assistant_model=ASSISTED_FORMS["recompute"](_model("gpt2")),
                 max_new_tokens=3, assistant_confidence_threshold=0.0,
                 attention_mask=torch.ones_like(PROMPT))  # 8 prompt tokens + 2 drafts in the first call


def test_assisted_sampling_needs_one_vocabulary():
    def wide(input_ids):  # the target: 20 columns
        return torch.zeros(input_ids.shape[0], input_ids.shape[1], 20)

    with pytest.raises(ValueError, match=r"the assistant's logits have 16 vocabulary columns and the target's 20"):
        generate(wide, torch.tensor([[1, 2]]), assistant_model=Successor(), max_new_tokens=4, do_sample=True)
