"""`replay`: generate's step run again over the recorded tokens.

Scores equal `generate(..., output_scores=True)`'s bit for bit over random option sets (HF's processors
and hfbridge's samplers, per-row values, per-row generators), for every model form and from given
logits; stateful samplers over 200 tokens; XTC's coins re-drawn; banned strings re-simulated; a tiny
Llama through its cache (exact) and teacher-forced (within float rounding); the trainer's ratios; the
refusals, with their messages.
"""

from __future__ import annotations

import pytest
import torch
from _banned_reference import pieces_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hfbridge import Replay, compute_transition_scores, generate, replay

from _tiny_models import TinyCore, TinyRecompute, model_cache

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

V = 16
TABLE = torch.randn(V, V, generator=torch.Generator().manual_seed(0)) * 3
PROMPTS = torch.tensor([[1, 2, 3], [4, 5, 6]])
_model = model_cache()


def table_model(input_ids):  # [B, T] -> [B, T, V]: a bigram model
    return TABLE[input_ids]


def _seeded(seed, rows=None):
    if rows is None:
        return torch.Generator().manual_seed(seed)
    return [torch.Generator().manual_seed(seed + row) for row in range(rows)]


def _generate(options, *, new=12, seed=5, rows=None, model=table_model, prompts=PROMPTS, **extra):
    return generate(model, prompts, max_new_tokens=new, generator=_seeded(seed, rows), return_dict_in_generate=True,
                    output_scores=True, output_logits=True, **options, **extra)


def _assert_same(replayed: Replay, out) -> None:
    assert len(replayed.scores) == len(out.scores)
    for step, (mine, theirs) in enumerate(zip(replayed.scores, out.scores)):
        assert torch.equal(mine, theirs), step
    replayed.check()  # every generated token inside its kept support
    expected = compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    # HF's log_softmax runs over all steps stacked: other float rounding than per step
    assert torch.allclose(replayed.logprobs[replayed.generated], expected[replayed.generated], rtol=0, atol=1e-6)


SAMPLERS = {
    "temperature": st.sampled_from([0.5, 1.0, 1.7]),
    "top_k": st.integers(1, 12),
    "top_p": st.sampled_from([0.3, 0.8, 0.95]),
    "min_p": st.sampled_from([0.02, 0.2]),
    "typical_p": st.sampled_from([0.5, 0.9]),
    "epsilon_cutoff": st.sampled_from([1e-3, 3e-2]),
    "eta_cutoff": st.sampled_from([1e-3, 3e-2]),
    "repetition_penalty": st.sampled_from([0.8, 1.3]),
    "no_repeat_ngram_size": st.integers(2, 3),
    "min_new_tokens": st.integers(1, 6),
    "presence_penalty": st.sampled_from([0.4, 1.0]),
    "frequency_penalty": st.sampled_from([0.2, 0.7]),
    "dry_multiplier": st.sampled_from([0.5, 1.0]),
    "dynatemp_range": st.sampled_from([0.3, 0.8]),
    "smoothing_factor": st.sampled_from([0.2, 0.6]),
    "top_n_sigma": st.sampled_from([0.8, 2.0]),
    "xtc_probability": st.sampled_from([0.3, 1.0]),
    "mirostat": st.sampled_from([1, 2]),
    "adaptive_target": st.sampled_from([0.3, 0.7]),
}
PER_ROW = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.sets(st.sampled_from(sorted(SAMPLERS)), max_size=4), data=st.data(),
       per_row=st.booleans(), row_generators=st.booleans(), eos=st.booleans(), seed=st.integers(0, 99))
def test_scores_equal_generates_bit_for_bit(names, data, per_row, row_generators, eos, seed):
    if {"mirostat", "adaptive_target"} <= names:
        names = names - {"adaptive_target"}  # one of the two chooses the final distribution
    if row_generators and "xtc_probability" in names:
        names = names - {"xtc_probability"}  # XTC's coins come from one generator
    options = {name: data.draw(SAMPLERS[name], label=name) for name in sorted(names)}
    if per_row:
        for name in sorted(names & set(PER_ROW)):
            options[name] = [options[name], data.draw(SAMPLERS[name], label=f"{name} row 1")]
    if "dry_multiplier" in options:
        options["dry_sequence_breakers"] = []  # no tokenizer: id breakers only
    options.update(do_sample=True, **({"eos_token_id": 7, "pad_token_id": 0} if eos else {}))
    rows = 2 if row_generators else None
    out = _generate(options, seed=seed, rows=rows)
    replayed = replay(table_model, out.sequences, prompt_length=3, generator=_seeded(seed, rows), max_new_tokens=12,
                      **options)
    _assert_same(replayed, out)
    given_logits = replay(None, out.sequences, prompt_length=3, logits=out.logits, generator=_seeded(seed, rows),
                          max_new_tokens=12, **options)
    _assert_same(given_logits, out)


@pytest.mark.parametrize("options", [
    {"mirostat": 2, "mirostat_tau": 2.0},
    {"mirostat": 1, "mirostat_tau": 2.5, "mirostat_m": 8},
    {"adaptive_target": 0.4, "adaptive_decay": 0.9},
    {"thinking_budget": 5, "thinking_start": [7], "thinking_end": [8, 9]},
    {"mirostat": 2, "xtc_probability": 0.5, "xtc_threshold": 0.05, "top_k": 10},
], ids=["mirostat2", "mirostat1", "adaptive-p", "thinking-budget", "mirostat2-xtc"])
def test_stateful_samplers_over_200_tokens(options):
    options = dict(options, do_sample=True)
    out = _generate(options, new=200, seed=11)
    assert out.sequences.shape[1] == 203
    replayed = replay(table_model, out.sequences, prompt_length=3, generator=_seeded(11), **options)
    _assert_same(replayed, out)


def test_without_a_generator_no_draw_and_the_same_scores():
    options = {"do_sample": True, "top_p": 0.9, "mirostat": 2}
    out = _generate(options)
    before = torch.random.get_rng_state()
    replayed = replay(table_model, out.sequences, prompt_length=3, **options)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global RNG is left alone
    _assert_same(replayed, out)


def test_the_callers_generator_and_tensors_are_untouched():
    options = {"do_sample": True, "xtc_probability": 0.5, "top_k": 8}
    out = _generate(options)
    generator = _seeded(5)
    state = generator.get_state()
    sequences = out.sequences.clone()
    mask = torch.ones(2, 3, dtype=torch.long)
    replay(table_model, out.sequences, attention_mask=mask, generator=generator, max_new_tokens=12, **options)
    assert torch.equal(generator.get_state(), state)
    assert torch.equal(out.sequences, sequences) and torch.equal(mask, torch.ones(2, 3, dtype=torch.long))


def test_a_generator_in_another_state_is_caught():
    options = {"do_sample": True, "top_k": 8, "temperature": 1.5}
    out = _generate(options, new=30)
    with pytest.raises(ValueError, match=r"^replay\(\): at step \d+, row \d: drawing with `generator` gives another "
                                         r"token than the recorded \d+: the generator did not start"):
        replay(table_model, out.sequences, prompt_length=3, generator=_seeded(6), max_new_tokens=30, **options)


def test_per_row_prompt_lengths_are_left_padding():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    options = {"do_sample": True, "top_k": 5, "pad_token_id": 0}

    def masked(input_ids, attention_mask):
        return TABLE[input_ids] + attention_mask[..., None]

    out = _generate(options, model=masked, attention_mask=mask)
    by_lengths = replay(masked, out.sequences, prompt_length=[2, 3], max_new_tokens=12, **options)
    by_mask = replay(masked, out.sequences, attention_mask=mask, max_new_tokens=12, **options)
    _assert_same(by_lengths, out)
    _assert_same(by_mask, out)


def test_finished_rows_are_filler_and_num_return_sequences():
    options = {"do_sample": True, "top_k": 6, "eos_token_id": 2, "pad_token_id": 0, "num_return_sequences": 3}
    out = _generate(options, new=20, seed=1)
    replayed = replay(table_model, out.sequences, prompt_length=3, generator=_seeded(1), **options)
    _assert_same(replayed, out)
    tokens = out.sequences[:, 3:]
    for row in range(tokens.shape[0]):
        ended = (tokens[row] == 2).nonzero()
        expected = torch.ones(tokens.shape[1], dtype=torch.bool)
        if len(ended):
            expected[int(ended[0]) + 1:] = False
        assert torch.equal(replayed.generated[row], expected)


def test_kept_forms_and_masses():
    options = {"do_sample": True, "top_k": 3, "temperature": 0.7}
    out = _generate(options)
    replayed = replay(None, out.sequences, prompt_length=3, logits=out.logits, max_new_tokens=12, **options)
    for step, scores in enumerate(out.scores):
        kept = replayed.kept(step)
        assert torch.equal(kept, scores > float("-inf")) and torch.equal(kept.sum(1), torch.tensor([3, 3]))
        crow, columns = replayed.kept_csr(step)
        ids = replayed.kept_ids(step)
        assert crow.tolist() == [0, 3, 6] and torch.equal(columns, torch.cat(ids))
        assert ids[0].tolist() == sorted(torch.topk(out.logits[step][0], 3).indices.tolist())
        raw = torch.softmax(out.logits[step], -1)
        assert torch.allclose(replayed.kept_mass[:, step], (raw * kept).sum(1), atol=1e-6)
        assert torch.allclose(replayed.raw_logprobs[:, step],
                              raw.log().gather(1, out.sequences[:, 3 + step, None])[:, 0], atol=1e-5)
    assert replayed.kept(-1).shape == (2, V)
    with pytest.raises(IndexError, match=r"^`step` must be an int in \[0, 12\) \(one per generated token\), got 12"):
        replayed.kept(12)


def test_importance_ratio_as_trl_computes_it():
    options = {"do_sample": True, "top_p": 0.9, "eos_token_id": 2, "pad_token_id": 0}
    out = _generate(options, new=16, seed=2)
    replayed = replay(table_model, out.sequences, prompt_length=3, max_new_tokens=16, **options)
    trainer = replayed.raw_logprobs  # a trainer without the chain: the raw model
    live = replayed.generated
    plain = torch.where(live, (trainer - replayed.logprobs).exp(), 1.0)
    assert torch.equal(replayed.importance_ratio(trainer), plain)
    assert torch.equal(replayed.importance_ratio(trainer, cap=1.0), plain.clamp(max=1.0))
    assert torch.equal(replayed.importance_ratio(trainer, cap=0.9, mode="token_mask"),
                       plain.masked_fill(plain > 0.9, 0.0))
    sums = torch.where(live, trainer - replayed.logprobs, 0.0).sum(-1, keepdim=True)
    assert torch.equal(replayed.importance_ratio(trainer, cap=0.5, mode="sequence_truncate"),
                       sums.exp().clamp(max=0.5))
    assert torch.equal(replayed.importance_ratio(trainer, cap=0.5, mode="sequence_mask"),
                       sums.exp().masked_fill(sums.exp() > 0.5, 0.0))
    assert (replayed.importance_ratio(trainer)[live] <= 1.0).all()  # top-p raises each kept token's probability
    with pytest.raises(ValueError, match=r"^`trainer_logprobs` must have shape \(rows, new tokens\) \(2, 16\), got "):
        replayed.importance_ratio(trainer[:, :3])
    with pytest.raises(TypeError, match=r"^`trainer_logprobs` must be a float tensor"):
        replayed.importance_ratio(replayed.tokens)
    assert torch.equal(replayed.importance_ratio(trainer, floor=0.5, cap=0.9), plain.clamp(min=0.5, max=0.9))
    assert torch.equal(replayed.importance_ratio(trainer, floor=0.5, mode="token_mask"),
                       plain.masked_fill(plain < 0.5, 0.0))
    with pytest.raises(ValueError, match=r"^`cap` must be a finite number >= 0 \(TRL's vllm_importance_sampling_clip_max\)"):
        replayed.importance_ratio(trainer, cap=True)
    with pytest.raises(ValueError, match=r"^`floor` \(2.0\) must not exceed `cap` \(1.0\)"):
        replayed.importance_ratio(trainer, floor=2.0, cap=1.0)
    with pytest.raises(ValueError, match=r"^`mode` must be one of"):
        replayed.importance_ratio(trainer, mode="token")


def test_check_catches_a_token_outside_the_support_and_other_logprobs():
    options = {"do_sample": True, "top_k": 2}
    out = _generate(options)
    replayed = replay(table_model, out.sequences, prompt_length=3, max_new_tokens=12, **options)
    replayed.check(replayed.logprobs.clone())
    shifted = replayed.logprobs.clone()
    shifted[0, 1] += 1e-6
    with pytest.raises(ValueError, match=r"^row 0, step 1: the reported log-probability"):
        replayed.check(shifted)
    replayed.check(replayed.logprobs + 1e-6, atol=1e-5)
    other = out.sequences.clone()
    other[1, 3] = int(torch.topk(out.logits[0][1], V).indices[-1])  # the least likely token: outside top-2
    with pytest.raises(ValueError, match=r"^row 1, step 0: token \d+ is outside the support the chain kept there"):
        replay(table_model, other, prompt_length=3, max_new_tokens=12, **options).check()


def test_banned_strings_are_run_again_and_checked():
    tok = pieces_tokenizer(32)
    core = TinyCore(vocab=32, seed=3)
    prompt = torch.tensor([[5, 9]])
    plain = generate(TinyRecompute(core), prompt, max_new_tokens=8)
    banned = tok.decode(plain[0, 2:].tolist())[2:4]
    options = {"do_sample": True, "top_k": 4, "banned_strings": [banned], "tokenizer": tok, "max_new_tokens": 8}
    out = generate(TinyRecompute(core), prompt, generator=_seeded(4), return_dict_in_generate=True, output_scores=True,
                   **options)
    replayed = replay(TinyRecompute(core), out.sequences, prompt_length=2, generator=_seeded(4), **options)
    _assert_same(replayed, out)
    with pytest.raises(ValueError, match=r"^replay\(\): with `banned_strings` / `banned_regex` and sampling, the "
                                         r"rolled-back steps drew random numbers"):
        replay(TinyRecompute(core), out.sequences, prompt_length=2, **options)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_transformers_model_through_its_cache_is_exact(name):
    model = _model(name)
    prompts = torch.tensor([[0, 3, 4, 5], [6, 7, 8, 9]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    options = {"do_sample": True, "top_p": 0.9, "repetition_penalty": 1.2, "pad_token_id": 0}
    out = _generate(options, model=model, prompts=prompts, attention_mask=mask, new=10)
    replayed = replay(model, out.sequences, attention_mask=mask, generator=_seeded(5), max_new_tokens=10, **options)
    _assert_same(replayed, out)
    forced = replay(model, out.sequences, attention_mask=mask, teacher_forced=True, max_new_tokens=10, **options)
    forced.check()
    gap = max(float(torch.where((a > -torch.inf) & (b > -torch.inf), a - b, 0.0).abs().max())
              for a, b in zip(forced.scores, out.scores))
    assert gap < 1e-4  # float rounding of one forward over the sequences against cached decoding
    assert torch.allclose(forced.raw_logprobs, replayed.raw_logprobs, rtol=0, atol=1e-4)


def test_refusals():
    out = _generate({"do_sample": True, "xtc_probability": 0.5})
    common = {"prompt_length": 3, "max_new_tokens": 12}
    with pytest.raises(ValueError, match=r"^replay\(\): `xtc_probability` draws a coin per row and step from the "
                                         r"generator, which the sequences do not show; pass generator="):
        replay(table_model, out.sequences, do_sample=True, xtc_probability=0.5, **common)
    with pytest.raises(ValueError, match=r"^replay\(\): beam search is not replayed: its scores are not one row's"):
        replay(table_model, out.sequences, num_beams=2, **common)
    with pytest.raises(ValueError, match=r"^replay\(\): `assistant_model` is not taken: assisted decoding is not "):
        replay(table_model, out.sequences, assistant_model=table_model, **common)
    with pytest.raises(TypeError, match=r"^replay\(\): pass the model \(any form generate takes\) or `logits=` "
                                        r"\(the logits of every step\), exactly one; got both"):
        replay(table_model, out.sequences, logits=out.logits, **common)
    with pytest.raises(TypeError, match=r"^replay\(\): `sequences` must be a \(rows, prompt \+ new\) tensor of token "
                                        r"ids, got shape \(2, 15\) of torch.float32"):
        replay(table_model, out.sequences.float(), **common)
    with pytest.raises(TypeError, match=r"^replay\(\): pass `prompt_length` \(where the new tokens start\)"):
        replay(table_model, out.sequences, max_new_tokens=12)
    with pytest.raises(ValueError, match=r"^replay\(\): `prompt_length` must be in \[1, 15\]"):
        replay(table_model, out.sequences, prompt_length=0)
    with pytest.raises(TypeError, match=r"^`teacher_forced` must be"):
        replay(table_model, out.sequences, teacher_forced="yes", **common)
    with pytest.raises(ValueError, match=r"^replay\(\): `logits` must be one \(rows, vocab\) tensor per new token "
                                         r"\(12\), got 11 steps"):
        replay(None, out.sequences, logits=out.logits[:11], **common)
    with pytest.raises(ValueError, match=r"^replay\(\): every row had finished after step 0"):
        replay(table_model, out.sequences, prompt_length=3, max_new_tokens=1)


@pytest.mark.parametrize("options", [
    {"do_sample": True, "bad_words_ids": [[3], [5, 6]], "suppress_tokens": [1], "begin_suppress_tokens": [2]},
    {"do_sample": True, "sequence_bias": {(4,): 2.0}, "exponential_decay_length_penalty": (2, 1.5),
     "eos_token_id": 7, "pad_token_id": 0},
    {"do_sample": True, "guidance_scale": 1.5},
    {"do_sample": True, "epsilon_cutoff": 0.01, "eta_cutoff": 0.01, "typical_p": 0.8, "min_length": 8,
     "eos_token_id": 7, "pad_token_id": 0},
    {"do_sample": False, "repetition_penalty": 1.5, "no_repeat_ngram_size": 2},
    {"do_sample": True, "temperature": [0.0, 0.7], "top_k": [2, 3]},
], ids=["bans", "bias-decay", "guidance", "cutoffs", "greedy", "greedy-row"])
def test_more_of_hfs_processors(options):
    out = _generate(options)
    replayed = replay(table_model, out.sequences, prompt_length=3, generator=_seeded(5), max_new_tokens=12, **options)
    _assert_same(replayed, out)


def test_prompt_length_as_numpy_or_tensor_and_no_new_tokens():
    import numpy as np

    out = _generate({"do_sample": True, "top_k": 4})
    for length in (np.int64(3), torch.tensor(3)):
        _assert_same(replay(table_model, out.sequences, prompt_length=length, max_new_tokens=12, do_sample=True,
                            top_k=4), out)
    empty = replay(table_model, out.sequences[:, :3], prompt_length=3, do_sample=True, top_k=4)
    assert empty.scores == () and empty.logprobs.shape == (2, 0)
    with pytest.raises(TypeError, match=r"^replay\(\): `prompt_length` must be an int or one int per row \(2\), "
                                        r"got 3.0"):
        replay(table_model, out.sequences, prompt_length=3.0)


def test_logits_a_generation_could_not_have_drawn_from_are_refused():
    out = _generate({"do_sample": True, "top_k": 4})
    logits = [step.clone() for step in out.logits]
    logits[2][1, 5] = float("nan")
    with pytest.raises(ValueError, match=r"^replay\(\): at step 2, row 1 has nothing to draw: its scores after the "
                                         r"processors are NaN, -inf everywhere or \+inf"):
        replay(None, out.sequences, prompt_length=3, logits=tuple(logits), max_new_tokens=12, do_sample=True, top_k=4)
    logits[2][1, 5] = float("inf")
    with pytest.raises(ValueError, match=r"^replay\(\): at step 2, row 1 has nothing to draw"):
        replay(None, out.sequences, prompt_length=3, logits=tuple(logits), max_new_tokens=12, do_sample=True, top_k=4)


def _model_forms(rows: int, length: int):
    from _tiny_models import every_model_form

    core = TinyCore(vocab=V, seed=3)
    return lambda: every_model_form(core, rows, length)


@pytest.mark.parametrize("form", ["recompute", "returns_cache", "input_pos", "hooks"])
def test_every_model_form_through_its_cache(form):
    forms = _model_forms(rows=2, length=32)
    mask = torch.tensor([[1, 1, 1], [1, 1, 1]] if form == "input_pos" else [[0, 1, 1], [1, 1, 1]])  # no padding there
    options = {"do_sample": True, "top_k": 6, "mirostat": 2, "pad_token_id": 0}
    out = _generate(options, model=forms()[form], attention_mask=mask)
    replayed = replay(forms()[form], out.sequences, attention_mask=mask, generator=_seeded(5), max_new_tokens=12,
                      **options)
    _assert_same(replayed, out)
    if form != "recompute":
        with pytest.raises(TypeError, match=r"^replay\(\): `teacher_forced=True` needs a plain callable returning the "
                                            r"logits of every position or a transformers model, got "):
            replay(forms()[form], out.sequences, attention_mask=mask, teacher_forced=True, max_new_tokens=12,
                   **options)


def test_more_refusals():
    options = {"do_sample": True, "xtc_probability": 0.5, "prompt_length": 3, "max_new_tokens": 12}
    out = _generate({"do_sample": True, "xtc_probability": 0.5})
    with pytest.raises(ValueError, match=r"^replay\(\): with fast=True the generation drew XTC's coins and its tokens "
                                         r"from another random stream than exact mode's"):
        replay(table_model, out.sequences, generator=_seeded(5), fast=True, **options)
    with pytest.raises(ValueError, match=r"^replay\(\): `progress` and `synced_gpus` are not taken"):
        replay(table_model, out.sequences, progress=True, **options)
    tok = pieces_tokenizer(V)
    bans = {"banned_strings": ["ab"], "tokenizer": tok, "do_sample": False, "prompt_length": 3, "max_new_tokens": 12}
    with pytest.raises(ValueError, match=r"^replay\(\): `banned_strings` / `banned_regex` roll rows back and try other "
                                         r"tokens, whose logits neither `logits=` nor one teacher-forced forward hold"):
        replay(None, out.sequences, logits=out.logits, **bans)
    with pytest.raises(ValueError, match=r"^replay\(\): running the generation again with `generator` gives other "
                                         r"sequences than `sequences`"):
        replay(table_model, out.sequences, **bans)  # greedy runs give other tokens than these sampled ones


def test_steps_past_the_end_of_every_row_are_refused():
    def ends(input_ids):  # [B, T] -> [B, T, V]: token 7 (eos) first
        return torch.nn.functional.one_hot(torch.full_like(input_ids, 7), V).float()

    out = generate(ends, PROMPTS, max_new_tokens=5, eos_token_id=7, pad_token_id=0)
    assert out.shape == (2, 4)
    longer = torch.cat([out, torch.zeros(2, 1, dtype=torch.long)], dim=1)  # a pad column generate never made
    with pytest.raises(ValueError, match=r"^replay\(\): every row had finished after step 0 \(the stopping criteria"):
        replay(ends, longer, prompt_length=3, max_new_tokens=5, eos_token_id=7, pad_token_id=0)
    assert replay(ends, out, prompt_length=3, max_new_tokens=5, eos_token_id=7, pad_token_id=0).generated.all()


def test_max_time_is_not_replayed_and_the_callers_config_is_untouched():
    from transformers import GenerationConfig

    out = _generate({"do_sample": True, "top_k": 3})
    config = GenerationConfig(max_time=1e-9, do_sample=True, top_k=3, max_new_tokens=12)
    replayed = replay(table_model, out.sequences, prompt_length=3, generation_config=config, max_time=1e-9)
    _assert_same(replayed, out)  # no row finished by the replay's own clock
    assert config.max_time == 1e-9


def test_per_prompt_values_and_generators_with_num_return_sequences():
    options = {"do_sample": True, "top_p": [0.5, 0.95], "temperature": [0.7, 1.2], "dry_multiplier": [0.0, 0.8],
               "dry_sequence_breakers": [], "num_return_sequences": 2}
    out = _generate(options, rows=4, new=10)
    _assert_same(replay(table_model, out.sequences, prompt_length=3, generator=_seeded(5, 4), max_new_tokens=10,
                        **options), out)


def test_phase_aware_sampling_is_refused_by_name():
    table = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
    sequences = torch.tensor([[1, 2, 3, 4, 5]])
    with pytest.raises(ValueError, match=r"replay\(\): `thinking_options` \(phase-aware sampling\) is not replayed"):
        replay(lambda ids: table[ids], sequences, prompt_length=3, thinking_start=[4], thinking_end=[5],
               thinking_options={"temperature": 0.5})
