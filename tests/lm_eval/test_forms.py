"""HFBridgeLM with custom (non-HF) models in every form, hfbridge's options, and its refusals of bad input."""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval.api", reason="lm-eval is not installed (pip install -e '.[lm-eval]')")

import torch
from lm_eval.api.instance import Instance

from hfbridge import InputPos, Recompute, ReturnsCache, generate
from hfbridge.lm_eval import HFBridgeLM

from _tiny_models import TinyCached, TinyCore, TinyFast, TinyMasked, TinyRecompute, char_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
CONTEXTS = ["abc", "hello world", "x", "the quick brown fox", "12.5", "zz"]


def requests(kind, args):
    return [Instance(kind, {}, arg, index) for index, arg in enumerate(args)]


def custom_forms():
    core = TinyCore(vocab=45, max_len=64)
    fast = TinyFast(core)
    fast.setup_caches(max_batch_size=8, max_seq_length=64)
    return {"recompute": TinyRecompute(core), "masked": TinyMasked(core), "input_pos": InputPos(fast),
            "returns_cache": ReturnsCache(TinyCached(core)), "max_context": Recompute(TinyMasked(core), max_context=64)}


def by_hand(core, tokenizer, context, continuation):
    """log p(continuation | context) and is_greedy from the model's logits, one request at a time."""
    context_ids, whole = tokenizer.encode(context), tokenizer.encode(context + continuation)
    ids = torch.tensor([whole[:-1]])
    with torch.no_grad():
        logprobs = TinyMasked(core)(ids, torch.ones_like(ids))[0].log_softmax(-1)  # [T, V]
    rows = logprobs[len(context_ids) - 1:]
    wanted = torch.tensor(whole[len(context_ids):])
    return float(rows.gather(1, wanted[:, None]).sum()), bool((rows.argmax(-1) == wanted).all())


@pytest.mark.parametrize("form", ["recompute", "masked", "input_pos", "returns_cache", "max_context"])
def test_loglikelihood_of_custom_models_by_hand(form):
    model = custom_forms()[form]
    tokenizer = char_tokenizer()
    pairs = [("abc", "d"), ("abc", "x"), ("hello", " world"), ("the quick", " brown fox"), ("1", "2"), ("q", "zz")]
    ours = HFBridgeLM(model, tokenizer, batch_size=4, max_length=64).loglikelihood(requests("loglikelihood", pairs))
    core = TinyCore(vocab=45, max_len=64)
    expected = [by_hand(core, tokenizer, *pair) for pair in pairs]
    assert [score for score, _ in ours] == pytest.approx([score for score, _ in expected], abs=1e-5)
    assert [greedy for _, greedy in ours] == [greedy for _, greedy in expected]


@pytest.mark.parametrize("form", ["recompute", "masked", "input_pos", "returns_cache"])
def test_generate_until_of_custom_models_equals_one_prompt_at_a_time(form):
    tokenizer = char_tokenizer()
    batch = requests("generate_until", [(context, {"until": ["e"], "max_gen_toks": 6}) for context in CONTEXTS])
    ours = HFBridgeLM(custom_forms()[form], tokenizer, batch_size=4).generate_until(batch)
    core = TinyCore(vocab=45, max_len=64)
    for context, text in zip(CONTEXTS, ours):
        ids = torch.tensor([tokenizer.encode(context)])
        alone = generate(TinyRecompute(core), ids, max_new_tokens=6, eos_token_id=0)  # greedy, one prompt
        assert text == tokenizer.decode(alone[0, ids.shape[1]:], skip_special_tokens=True).split("e")[0]


def test_generate_defaults_and_request_options_reach_generate():
    tokenizer = char_tokenizer()
    core = TinyCore(vocab=45, max_len=64)
    lm = HFBridgeLM(TinyMasked(core), tokenizer, repetition_penalty=3.0, no_repeat_ngram_size=2)
    batch = requests("generate_until", [("abc", {"until": [], "max_gen_toks": 8}),
                                        ("abc", {"until": [], "max_gen_toks": 8, "repetition_penalty": 1.0})])
    ids = torch.tensor([tokenizer.encode("abc")])
    expected = [tokenizer.decode(generate(TinyMasked(core), ids, max_new_tokens=8, eos_token_id=0,
                                          repetition_penalty=penalty, no_repeat_ngram_size=2)[0, 3:],
                                 skip_special_tokens=True) for penalty in (3.0, 1.0)]
    assert lm.generate_until(batch) == expected
    assert expected[0] != expected[1]


def test_sampling_with_a_community_sampler_follows_the_seed():
    tokenizer = char_tokenizer()
    core = TinyCore(vocab=45, max_len=64)
    lm = HFBridgeLM(TinyMasked(core), tokenizer, batch_size=3, dry_multiplier=0.8, top_n_sigma=2.0)
    batch = requests("generate_until", [(context, {"until": [], "max_gen_toks": 10, "do_sample": True,
                                                   "temperature": 1.5}) for context in CONTEXTS[:3]])
    torch.manual_seed(3)
    first = lm.generate_until(batch)
    torch.manual_seed(3)
    assert lm.generate_until(batch) == first
    torch.manual_seed(4)
    assert lm.generate_until(batch) != first


def test_layout_and_padded_vocabulary_score_as_the_plain_model():
    tokenizer = char_tokenizer()
    core = TinyCore(vocab=45, max_len=64)
    plain = TinyRecompute(core)

    def padded_time_major(input_ids):  # [T, B, V + 19]: the last 19 columns are padding
        logits = plain(input_ids)
        return {"logits": torch.cat([logits, torch.full((*logits.shape[:2], 19), 9.0)], -1).transpose(0, 1)}

    pairs = requests("loglikelihood", [("abc", "de"), ("hello", " world"), ("q", "z")])
    expected = HFBridgeLM(plain, tokenizer, batch_size=2, max_length=64).loglikelihood(pairs)
    ours = HFBridgeLM(padded_time_major, tokenizer, batch_size=2, max_length=64, layout="t b v",
                      vocab_size=45).loglikelihood(pairs)
    assert ours == expected


def test_the_callers_tokenizer_is_left_as_it_was():
    tokenizer = char_tokenizer()
    tokenizer.pad_token = None
    tokenizer.padding_side = "right"
    lm = HFBridgeLM(TinyMasked(TinyCore(vocab=45)), tokenizer, batch_size=3)
    lm.generate_until(requests("generate_until", [(c, {"until": ["."], "max_gen_toks": 3}) for c in CONTEXTS]))
    assert tokenizer.pad_token is None and tokenizer.padding_side == "right"
    assert lm.pad_token_id == tokenizer.eos_token_id  # no pad, no unk: eos pads, as HFLM's choice


def test_think_end_token_keeps_the_answer_after_it():
    tokenizer = char_tokenizer()
    lm = HFBridgeLM(TinyMasked(TinyCore(vocab=45)), tokenizer, think_end_token="b")
    plain = HFBridgeLM(TinyMasked(TinyCore(vocab=45)), tokenizer)
    batch = requests("generate_until", [(context, {"until": [], "max_gen_toks": 12}) for context in CONTEXTS])
    for thought, answer in zip(plain.generate_until(batch), lm.generate_until(batch)):
        assert answer == (thought.split("b")[-1].lstrip() if "b" in thought else thought)


def test_chat_template_as_hflm():
    from lm_eval.models.huggingface import HFLM
    from transformers import GPT2Config, GPT2LMHeadModel
    tokenizer = char_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}.{% endfor %}"
                               "{% if add_generation_prompt %}a:{% endif %}")
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    reference = HFLM(pretrained=GPT2LMHeadModel(GPT2Config(vocab_size=45, n_embd=8, n_layer=1, n_head=1)),
                     tokenizer=char_tokenizer().__class__(tokenizer_object=tokenizer.backend_tokenizer,
                                                          eos_token="<eos>", pad_token="<pad>",
                                                          chat_template=tokenizer.chat_template))
    lm = HFBridgeLM(TinyMasked(TinyCore(vocab=45)), tokenizer)
    assert lm.apply_chat_template(chat) == reference.apply_chat_template(chat) == "s:be brief.u:hi.a:"
    # continue_final_message: the last message is left open for the model to continue
    assert lm.apply_chat_template(chat, False) == reference.apply_chat_template(chat, False) == "s:be brief.u:hi"
    assert lm.chat_template(True) == tokenizer.chat_template


@pytest.mark.parametrize(("arguments", "error", "message"), [
    ({"batch_size": "auto"}, ValueError, "`batch_size` must be a positive int (no automatic batch size: pass a number), got 'auto'."),
    ({"batch_size": 0}, ValueError, "`batch_size` must be a positive int (no automatic batch size: pass a number), got 0."),
    ({"batch_size": True}, ValueError, "`batch_size` must be a positive int (no automatic batch size: pass a number), got True."),
    ({"max_length": 2.5}, ValueError, "`max_length` must be a positive int, got 2.5."),
    ({"max_gen_toks": -1}, ValueError, "`max_gen_toks` must be a positive int, got -1."),
    ({"logits_cache": "yes"}, TypeError, "`logits_cache` must be True or False, got 'yes'."),
    ({"prefix_token_id": "0"}, TypeError, "`prefix_token_id` must be a token id (int), got '0'."),
    ({"device": "gpu"}, ValueError, "`device` must name a torch device ('cpu', 'cuda', 'cuda:1'), got 'gpu'."),
    ({"layout": "b v"}, ValueError, "scoring needs the logits of every position of every row: `layout` must have a sequence axis 't' and one batch axis, got 'b v'."),
    ({"vocab_size": 0}, ValueError, "`vocab_size` must be a positive int, got 0."),
    ({"model": "no_colon"}, ValueError, "`model` must be 'package.module:function' (a function that returns the model), got 'no_colon'."),
    ({"model": "json:nothing_here"}, ValueError, "`model`='json:nothing_here': 'json' has no function 'nothing_here'."),
    ({"model": "json:JSONDecoder"}, TypeError, "`model`='json:JSONDecoder': JSONDecoder() must return the model (a callable), got JSONDecoder."),
    ({"model": 3}, TypeError, "`model` must be a model (a callable, an adapter or a PreTrainedModel) or a 'package.module:function' string, got int."),
    ({"max_new_tokens": 5}, ValueError, "`max_new_tokens` cannot be a generate default of HFBridgeLM: each request sets it; pass max_gen_toks= (new tokens per request) instead."),
    ({"attention_mask": None}, ValueError, "`attention_mask` cannot be a generate default of HFBridgeLM: each request sets it."),
    ({"tokenizer": object()}, TypeError, "`tokenizer` must be a transformers tokenizer or its name or path, got object."),
])
def test_bad_arguments_are_named(arguments, error, message):
    given = {"model": TinyMasked(TinyCore(vocab=45)), "tokenizer": char_tokenizer(), **arguments}
    with pytest.raises(error) as raised:
        HFBridgeLM(given.pop("model"), given.pop("tokenizer"), **given)
    assert str(raised.value) == message


def test_bad_requests_are_named():
    lm = HFBridgeLM(TinyMasked(TinyCore(vocab=45)), char_tokenizer(), max_length=8)
    with pytest.raises(ValueError, match=r"^requested max tokens to generate \(8\) must be less than the model's "):
        lm.generate_until(requests("generate_until", [("abc", {"until": [], "max_gen_toks": 8})]))
    with pytest.raises(ValueError, match=r"^a continuation of 9 tokens is longer than `max_length`=8\.$"):
        lm.loglikelihood(requests("loglikelihood", [("a", "bcdefghij")]))
    with pytest.raises(TypeError, match="^a generate_until request's gen_kwargs must be a dict, got str.$"):
        lm.generate_until(requests("generate_until", [("abc", "until=x")]))
    wrong_rows = HFBridgeLM(lambda ids: torch.zeros(1, ids.shape[1], 45), char_tokenizer(), batch_size=2)
    with pytest.raises(ValueError, match=r"^the model returned logits for 1 rows, but was given 2 "):
        wrong_rows.loglikelihood(requests("loglikelihood", [("a", "b"), ("ab", "c")]))
    typo = HFBridgeLM(TinyMasked(TinyCore(vocab=45)), char_tokenizer(), tempreature=0.5)  # generate's own check
    with pytest.raises(TypeError, match=r"^generate\(\) got `tempreature`, .* Did you mean `temperature`\?$"):
        typo.generate_until(requests("generate_until", [("abc", {"until": []})]))
    with pytest.raises(TypeError, match=r"^the model must return floating-point logits"):
        HFBridgeLM(lambda ids: ids, char_tokenizer()).loglikelihood(requests("loglikelihood", [("a", "b")]))
