"""Beam search and beam sampling: `hfbridge.generate(num_beams=...)` equals HF's `model.generate`.

Tiny random GPT-2 and Llama models are called through every model form (the recompute form against
`model.generate(use_cache=False)`, the cache forms against `model.generate()` with HF's cache), on
a left-padded batch; a custom model with a tuple-of-tensors cache must give its recompute form's
beams; and everything beam search cannot do is refused before the first model call.
"""

from __future__ import annotations

import re

import pytest
import torch
from transformers import DynamicCache, GenerationConfig

from hfbridge import Hooks, InputPos, Recompute, ReturnsCache, generate
from hfbridge._hf.stand_in import generation_option_names
from hfbridge._models.cache import CacheTypeError, reorder_cache

from _tiny_models import (
    HF_MODELS,
    InputPosHF,
    TinyCached,
    TinyCore,
    TinyFast,
    TinyMasked,
    TinyRecompute,
    model_cache,
    positions,
    recompute_callable,
    returns_cache_callable,
)

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

PAD = 1
EOS_EVERY_4TH = list(range(0, 48, 4))
PADDED = (torch.tensor([[5, 9, 13, 2, 7, 21], [0, 0, 0, 3, 4, 11]]), torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]]))
UNPADDED = (torch.tensor([[5, 9, 13, 2, 7, 21], [40, 3, 3, 18, 4, 11]]), torch.ones(2, 6, dtype=torch.long))
FULL_OUTPUT = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)

CONFIGS = {
    "beams": dict(num_beams=3),
    "return_sequences_eos_length_penalty": dict(num_beams=4, num_return_sequences=3, eos_token_id=EOS_EVERY_4TH,
                                                pad_token_id=PAD, length_penalty=0.6, **FULL_OUTPUT),
    "early_stopping_true": dict(num_beams=3, early_stopping=True, eos_token_id=EOS_EVERY_4TH, pad_token_id=PAD,
                                **FULL_OUTPUT),
    "early_stopping_never": dict(num_beams=3, early_stopping="never", eos_token_id=EOS_EVERY_4TH, pad_token_id=PAD,
                                 length_penalty=2.0, **FULL_OUTPUT),
    "beam_sample": dict(num_beams=3, do_sample=True, top_k=12, temperature=0.8, eos_token_id=EOS_EVERY_4TH,
                        pad_token_id=PAD, num_return_sequences=2, **FULL_OUTPUT),
    "one_new_token": dict(num_beams=2, max_new_tokens=1, num_return_sequences=2, **FULL_OUTPUT),
    "processors_lengths": dict(num_beams=2, repetition_penalty=1.5, no_repeat_ngram_size=2, min_new_tokens=3,
                               max_length=13, max_new_tokens=None, eos_token_id=EOS_EVERY_4TH, pad_token_id=PAD),
}

_model = model_cache()


def _input_pos(hf, batch):
    model = InputPosHF(hf)
    # the cache lives in the model: the hook reorders it (an HF Cache, or 4.x's legacy tuples)
    return InputPos(model, reorder_cache=lambda beam_idx: setattr(model, "cache", reorder_cache(model.cache, beam_idx)))


def _hooks(hf, batch):
    def prepare_inputs(input_ids, attention_mask, past_key_values=None):
        fed = 0 if past_key_values is None else past_key_values_length(past_key_values)
        return {"input_ids": input_ids[:, fed:], "attention_mask": attention_mask, "use_cache": True,
                "position_ids": positions(attention_mask)[:, fed:], "past_key_values": past_key_values}

    def update_state(outputs, state):
        return {**state, "past_key_values": outputs.past_key_values}

    return Hooks(hf, prepare_inputs, update_state)  # the default reorder_state reorders past_key_values


def past_key_values_length(cache):
    return cache.get_seq_length() if hasattr(cache, "get_seq_length") else cache[0][0].shape[2]


PATHS = {  # name -> (adapter factory, HF's use_cache, prompts)
    "recompute": (lambda hf, batch: Recompute(recompute_callable(hf)), False, PADDED),
    "returns_cache": (lambda hf, batch: ReturnsCache(returns_cache_callable(hf)), True, PADDED),
    "input_pos": (_input_pos, True, UNPADDED),
    "hooks": (_hooks, True, PADDED),
}
CASES = [(config, model, path) for config in CONFIGS for model in HF_MODELS for path in PATHS
         if path in ("recompute", "returns_cache") or config in ("return_sequences_eos_length_penalty", "beam_sample")]


def _options(name):
    options = {"max_new_tokens": 7, **CONFIGS[name]}
    return {key: value for key, value in options.items() if value is not None}


def assert_same_beams(ours, theirs):
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor)
        assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"
        return
    assert type(ours) is type(theirs)
    assert torch.equal(ours.sequences, theirs.sequences), f"\nhfbridge:\n{ours.sequences}\nHF:\n{theirs.sequences}"
    assert torch.equal(ours.beam_indices, theirs.beam_indices)
    torch.testing.assert_close(ours.sequences_scores, theirs.sequences_scores)
    for field in ("scores", "logits"):
        mine, hf = getattr(ours, field), getattr(theirs, field)
        assert (mine is None) == (hf is None), field
        if hf is not None:
            assert len(mine) == len(hf), field
            for a, b in zip(mine, hf):
                torch.testing.assert_close(a, b)


@pytest.mark.parametrize(("config_name", "model_name", "path"), CASES, ids=["-".join(case) for case in CASES])
def test_beam_search_matches_hf(config_name, model_name, path):
    options = _options(config_name)
    hf = _model(model_name)
    make_adapter, use_cache, (prompt, mask) = PATHS[path]
    prompt_before, mask_before = prompt.clone(), mask.clone()

    torch.manual_seed(99)
    theirs = hf.generate(prompt, attention_mask=mask, use_cache=use_cache, **options)
    torch.manual_seed(99)
    ours = generate(make_adapter(hf, prompt.shape[0]), prompt, attention_mask=mask, **options)

    assert_same_beams(ours, theirs)
    assert torch.equal(prompt, prompt_before) and torch.equal(mask, mask_before)


def test_the_configs_exercise_finished_beams_and_distinct_returns():
    """Beams really finish on eos at different lengths, and each prompt gets several different sequences."""
    hf = _model("llama")
    prompt, mask = PADDED
    out = generate(Recompute(recompute_callable(hf)), prompt, attention_mask=mask,
                   **_options("return_sequences_eos_length_penalty"))
    assert out.sequences.shape[0] == 2 * 3
    for prompt_rows in out.sequences.view(2, 3, -1):
        assert len({tuple(row) for row in prompt_rows.tolist()}) > 1
    lengths = (out.beam_indices >= 0).sum(dim=1)
    assert lengths.min() < lengths.max(), "some beams must finish early"


def test_generation_config_selects_beams():
    hf = _model("gpt2")
    prompt, mask = PADDED
    config = GenerationConfig(num_beams=3, max_new_tokens=5, length_penalty=0.5)
    theirs = hf.generate(prompt, attention_mask=mask, use_cache=False, generation_config=config)
    ours = generate(recompute_callable(hf), prompt, attention_mask=mask, generation_config=config)
    assert torch.equal(ours, theirs)


# ------------------------------------------------------------------------------------------
# Custom (non-HF) models: the cache forms give the recompute form's beams
# ------------------------------------------------------------------------------------------


def test_tuple_cache_model_beams_equal_its_recompute_form():
    core = TinyCore(vocab=32)
    prompt = torch.tensor([[3, 9, 4, 1], [0, 0, 7, 2]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    options = dict(max_new_tokens=8, num_beams=4, num_return_sequences=2, eos_token_id=[5, 6], pad_token_id=0,
                   return_dict_in_generate=True, output_scores=True)
    recomputed = generate(TinyMasked(core), prompt, attention_mask=mask, **options)
    cached = generate(ReturnsCache(TinyCached(core)), prompt, attention_mask=mask, **options)
    assert torch.equal(cached.sequences, recomputed.sequences)
    assert torch.equal(cached.beam_indices, recomputed.beam_indices)
    torch.testing.assert_close(cached.sequences_scores, recomputed.sequences_scores)
    keys, values = cached.past_key_values  # the model's own (k, v) tuple came back
    assert keys.shape[0] == values.shape[0] == 2 * 4


def test_gpt_fast_model_beams_with_a_reorder_hook():
    core = TinyCore(vocab=32)
    prompt = torch.tensor([[3, 9, 4, 1], [8, 2, 7, 2]])
    fast = TinyFast(core)
    fast.setup_caches(max_batch_size=2 * 3, max_seq_length=16)

    def reorder(beam_idx):  # rows of the model's own cache buffers follow the beams
        fast.k_cache[: len(beam_idx)] = fast.k_cache[beam_idx]
        fast.v_cache[: len(beam_idx)] = fast.v_cache[beam_idx]

    options = dict(max_new_tokens=6, num_beams=3, length_penalty=0.5)
    expected = generate(TinyRecompute(core), prompt, **options)
    assert torch.equal(generate(InputPos(fast, reorder_cache=reorder), prompt, **options), expected)
    assert fast.calls[0] == ((6, 4), [0, 1, 2, 3]) and fast.calls[1] == ((6, 1), [4])


def test_hooks_reorder_state_hook_receives_every_step():
    core = TinyCore(vocab=32)
    seen = []

    def prepare_inputs(input_ids, attention_mask, kv=None):
        return {"idx": input_ids[:, 0 if kv is None else kv[0].shape[1]:], "cache": kv,
                "attention_mask": attention_mask}

    def update_state(outputs, state):
        return {**state, "kv": outputs[1]}

    def reorder_state(state, beam_idx):
        seen.append(beam_idx.tolist())
        return {**state, "kv": tuple(t[beam_idx] for t in state["kv"])}

    prompt = torch.tensor([[3, 9, 4, 1]])
    options = dict(max_new_tokens=5, num_beams=2)
    out = generate(Hooks(TinyCached(core), prepare_inputs, update_state, reorder_state=reorder_state), prompt,
                   **options)
    assert torch.equal(out, generate(TinyRecompute(core), prompt, **options))
    assert len(seen) == 5 and all(len(index) == 2 for index in seen)


# ------------------------------------------------------------------------------------------
# reorder_cache
# ------------------------------------------------------------------------------------------


def test_reorder_cache_nests_never_touch_the_callers_tensors():
    keys = torch.arange(6.0).view(3, 2)
    cache = {"layers": [(keys, keys + 10)], "length": 2, "note": None}
    before = keys.clone()
    out = reorder_cache(cache, torch.tensor([2, 2, 0]))
    assert torch.equal(keys, before) and out["length"] == 2 and out["note"] is None
    assert out["layers"][0][0].tolist() == [[4.0, 5.0], [4.0, 5.0], [0.0, 1.0]]
    assert isinstance(out["layers"], list) and isinstance(out["layers"][0], tuple)
    assert reorder_cache(None, torch.tensor([0])) is None


def test_reorder_cache_uses_the_hf_cache_own_method():
    cache = DynamicCache()
    keys = torch.arange(12.0).view(3, 1, 2, 2)
    cache.update(keys, keys + 100, layer_idx=0)
    out = reorder_cache(cache, torch.tensor([1, 0, 0]))
    assert out is cache
    reordered = out.to_legacy_cache()[0][0] if hasattr(out, "to_legacy_cache") else out.layers[0].keys
    assert torch.equal(reordered, keys[[1, 0, 0]])


def test_reorder_cache_errors_name_the_cache():
    with pytest.raises(CacheTypeError, match=re.escape(
        "cannot reorder a cache of type object (at cache[1]) for beam search: hfbridge reorders HF Cache objects "
        "and tuples / lists / dicts of batch-first tensors. Pass a hook, e.g. ReturnsCache(model, "
        "reorder_cache=lambda cache, beam_idx: ...), or override ModelAdapter.reorder_cache."
    )):
        reorder_cache((torch.zeros(2, 3), object()), torch.tensor([0, 1]))
    with pytest.raises(CacheTypeError, match=re.escape(
        "cannot reorder the cache for beam search: cache['k'] is a tensor of shape (3, 2), but every tensor in a "
        "cache nest must have the batch (2) first."
    )):
        reorder_cache({"k": torch.zeros(3, 2)}, torch.tensor([0, 1]))


# ------------------------------------------------------------------------------------------
# What beam search refuses, before the first model call, and errors during the loop
# ------------------------------------------------------------------------------------------


class Counting:
    def __init__(self, vocab=8):
        self.calls, self.vocab = 0, vocab

    def __call__(self, idx):
        self.calls += 1
        return torch.zeros(idx.shape[0], idx.shape[1], self.vocab)


def _refused(kind, message, model=None, **options):
    model = Counting() if model is None else model
    with pytest.raises(kind, match=re.escape(message)):
        generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3, **options)
    counting = model.model if hasattr(model, "model") else model
    assert counting.calls == 0


def test_beam_options_refused_before_any_call():
    from transformers import TextStreamer

    _refused(ValueError, "`streamer` cannot be used with beam search (HF's generate refuses it too",
             num_beams=2, streamer=TextStreamer(None))
    _refused(ValueError, "`generator` is not supported with beam search: HF's beam loop draws from the global RNG.",
             num_beams=2, do_sample=True, generator=torch.Generator())
    _refused(ValueError, "`fast=True` applies to sampling with num_beams=1", num_beams=2, do_sample=True, fast=True)
    _refused(ValueError, "`num_return_sequences` (3) has to be smaller or equal to `num_beams` (2)",
             num_beams=2, num_return_sequences=3)
    if "low_memory" in generation_option_names():
        _refused(ValueError, "`low_memory=True` (sequential beam search) is not supported", num_beams=2,
                 low_memory=True)


def test_input_pos_without_a_reorder_hook_is_refused_before_any_call():
    class Fast(torch.nn.Module):
        calls = 0

        def forward(self, idx, input_pos):
            Fast.calls += 1
            return torch.zeros(idx.shape[0], idx.shape[1], 8)

    with pytest.raises(TypeError, match=re.escape(
        "beam search reorders the model's cache after every step, and an InputPos model keeps its cache inside "
        "itself; pass InputPos(model, reorder_cache=fn) with fn(beam_idx) permuting the cache buffers' batch rows"
    )):
        generate(InputPos(Fast()), torch.tensor([[1, 2, 3]]), max_new_tokens=3, num_beams=2)
    assert Fast.calls == 0
    with pytest.raises(TypeError, match=re.escape(
        "`reorder_cache` must be callable as reorder_cache(beam_idx), got int."
    )):
        InputPos(Fast(), reorder_cache=3)


def test_unknown_cache_type_names_the_type_and_the_step():
    class Opaque:
        pass

    def model(idx, cache):
        return torch.zeros(idx.shape[0], idx.shape[1], 8), Opaque()

    with pytest.raises(CacheTypeError, match=re.escape("cannot reorder a cache of type Opaque (at cache) for beam "
                                                       "search")) as info:
        generate(ReturnsCache(model), torch.tensor([[1, 2, 3]]), max_new_tokens=3, num_beams=2)
    assert "raised while reordering the cache for beam search after step 0" in "".join(info.value.__notes__)
    # ... and a hook makes it work
    out = generate(ReturnsCache(model, reorder_cache=lambda cache, beam_idx: cache), torch.tensor([[1, 2, 3]]),
                   max_new_tokens=3, num_beams=2)
    assert out.shape == (1, 6)


def _faulty(fault, at_step, vocab=8):
    calls = []

    def model(idx):
        calls.append(1)
        logits = torch.zeros(idx.shape[0], idx.shape[1], vocab)
        return fault(logits) if len(calls) == at_step + 1 else logits

    return model


def test_bad_logits_during_beam_search_name_the_step():
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match=re.escape(
        "generate(): at step 2 the model returned logits of shape (5, 5, 8) (layout 'b t v'), which give 5 rows, "
        "expected 6: one per sequence (2 prompts x num_beams=3)."
    )):
        generate(_faulty(lambda x: x[:5], 2), prompt, max_new_tokens=4, num_beams=3)
    with pytest.raises(ValueError, match=re.escape("generate(): at step 1: `logits` contain NaN in row 0")):
        generate(_faulty(lambda x: x.fill_(float("nan")), 1), prompt, max_new_tokens=4, num_beams=3)
    with pytest.raises(ValueError, match=re.escape(
        "generate(): at step 3 the model returned logits with 7 vocabulary columns, but 8 at step 0"
    )):
        generate(_faulty(lambda x: x[..., :7], 3), prompt, max_new_tokens=4, num_beams=3)
    with pytest.raises(ValueError, match=re.escape(
        "generate(): at step 0: `input_ids` hold token id 9, outside the vocabulary of 8 tokens"
    )):
        generate(Counting(), torch.tensor([[1, 9]]), max_new_tokens=2, num_beams=2)


def test_model_exception_gets_the_step_note():
    def model(idx):
        if idx.shape[1] > 4:
            raise RuntimeError("boom")
        return torch.zeros(idx.shape[0], idx.shape[1], 8)

    with pytest.raises(RuntimeError, match="boom") as info:
        generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=4, num_beams=2)
    assert "raised at step 2" in "".join(info.value.__notes__)


def test_beams_with_layout_and_padded_vocabulary():
    """The logits go through the same extraction as sampling: any layout, padded vocabulary dropped."""
    hf = _model("gpt2")
    prompt, mask = PADDED
    base = recompute_callable(hf)

    def time_major_padded(input_ids, attention_mask):  # [T, B, V + 16], the extra columns huge
        logits = base(input_ids, attention_mask)
        padding = torch.full((*logits.shape[:2], 16), 1e4)
        return torch.cat([logits, padding], dim=-1).transpose(0, 1)

    options = dict(max_new_tokens=5, num_beams=3, num_return_sequences=2)
    theirs = hf.generate(prompt, attention_mask=mask, use_cache=False, **options)
    ours = generate(time_major_padded, prompt, attention_mask=mask, layout="t b v", vocab_size=48, **options)
    assert torch.equal(ours, theirs)


def test_refused_strategies_say_hf_moved_them_out_of_its_core():
    cases = [
        ("group beam search (selected by num_beam_groups > 1)", "group-beam-search",
         dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5)),
        ("constrained beam search (selected by constraints / force_words_ids)", "constrained-beam-search",
         dict(num_beams=2, force_words_ids=[[3]])),
        ("DoLa decoding (selected by dola_layers)", "dola", dict(dola_layers="high")),
    ]
    for what, repo, options in cases:
        _refused(ValueError, f"generate() does not support {what}: transformers 5 moved it out of its core into the "
                             f"Hub repository transformers-community/{repo}", **options)
    _refused(ValueError, "generate() does not support `penalty_alpha`=0.6: contrastive search re-ranks candidates "
                         "with the model's hidden states. Transformers 5 moved it out of its core into the Hub "
                         "repository transformers-community/contrastive-search.", penalty_alpha=0.6, top_k=4)


def test_a_vocabulary_smaller_than_the_candidates_is_an_error():
    with pytest.raises(ValueError, match=re.escape(
        "generate(): at step 0 the model returned logits with 3 vocabulary columns, but beam search keeps 4 "
        "candidates per beam (2, or 1 + the number of eos tokens)."
    )):
        generate(Counting(vocab=3), torch.tensor([[1, 2]]), max_new_tokens=2, num_beams=2, eos_token_id=[0, 1, 2],
                 pad_token_id=0)
    out = generate(Counting(vocab=2), torch.tensor([[1, 0]]), max_new_tokens=2, num_beams=3)
    assert out.shape == (1, 4)


def test_beams_with_prefix_allowed_tokens_fn_match_hf():
    hf = _model("llama")
    prompt, mask = PADDED

    def allowed(batch_id, input_ids):  # HF calls it per beam row with the prompt's index
        return [(int(input_ids[-1]) + batch_id + k) % 48 for k in (1, 2, 5)]

    options = dict(max_new_tokens=5, num_beams=3, num_return_sequences=2, prefix_allowed_tokens_fn=allowed)
    theirs = hf.generate(prompt, attention_mask=mask, use_cache=False, **options)
    ours = generate(recompute_callable(hf), prompt, attention_mask=mask, **options)
    assert torch.equal(ours, theirs)


def test_progress_bar_counts_the_beam_steps(capsys):
    out = generate(Counting(), torch.tensor([[1, 2]]), max_new_tokens=3, num_beams=2, progress=True)
    assert out.shape == (1, 5)
    assert "3/3" in capsys.readouterr().err


def test_reorder_state_must_return_the_state():
    core = TinyCore(vocab=32)

    def prepare_inputs(input_ids, attention_mask, **state):
        return {"idx": input_ids, "attention_mask": attention_mask}

    with pytest.raises(TypeError, match=re.escape(
        "generate(): after step 0: reorder_state must return the state dict, got NoneType."
    )):
        generate(Hooks(TinyMasked(core), prepare_inputs, reorder_state=lambda state, beam_idx: None),
                 torch.tensor([[1, 2]]), max_new_tokens=3, num_beams=2)


def test_loop_only_options_refused_with_beams_and_drafts():
    # check_every belongs to hfbridge's own greedy/sampling loop: refused, not ignored (synced_gpus: below).
    _refused(ValueError, "`check_every`=2 applies to greedy search and sampling; beam search runs HF's own loop",
             num_beams=2, check_every=2)
    _refused(ValueError, "`check_every`=3 applies to greedy search and sampling; assisted / prompt-lookup decoding",
             prompt_lookup_num_tokens=2, check_every=3)


def test_synced_gpus_refused_with_drafts():
    import socket

    import torch.distributed as dist

    with socket.socket() as probe:  # a free port for a one-rank gloo group
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        _refused(ValueError, "`synced_gpus` is on (ranks of torch.distributed kept in lockstep), which hfbridge "
                 "supports for greedy search, sampling and beam search, not yet for assisted / prompt-lookup "
                 "decoding", prompt_lookup_num_tokens=2, synced_gpus=True)
    finally:
        dist.destroy_process_group()
