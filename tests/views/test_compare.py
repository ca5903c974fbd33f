"""compare_step / compare_generation: each setting's tokens are exactly sample_step's / generate's from the same
generator state; where the chains agree the draws agree; differences, HTML and errors."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import LogitsProcessorList, TopKLogitsWarper

from hfbridge import GenerationComparison, StepComparison, compare_generation, compare_step, generate, sample_step

from _tiny_models import TinyCore, TinyRecompute, char_tokenizer

V = 40
LOGITS = torch.randn(4, 3, V, generator=torch.Generator().manual_seed(0)) * 2  # [B, T, V]
IDS = torch.randint(0, V, (4, 7), generator=torch.Generator().manual_seed(1))  # [B, S]

# HF's processors and hfbridge's samplers; scalar and per-row values
SETTINGS = {
    "top-p": dict(top_p=0.9),
    "min-p": dict(min_p=0.05),
    "typical": dict(typical_p=0.8, top_k=20),
    "per-row temperature": dict(temperature=[0.5, 1.0, 1.5, 0.0], top_p=[0.9, 0.8, 1.0, 0.7]),
    "penalties": dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2, penalty_last_n=-1,
                      no_repeat_ngram_size=2),
    "DRY": dict(dry_multiplier=0.8, dry_sequence_breakers=[]),
    "top-nσ": dict(top_n_sigma=1.0),
    "XTC": dict(xtc_threshold=0.05, xtc_probability=0.7),
    "mirostat": dict(mirostat=2, mirostat_tau=3.0),
    "adaptive-p": dict(adaptive_target=0.3),
    "smoothing": dict(smoothing_factor=0.3, dynatemp_range=0.5),
    "fast": dict(top_p=0.9, fast=True),
    "own processors": dict(processors=LogitsProcessorList([TopKLogitsWarper(3)])),
}


def _same_state(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_each_setting_gives_sample_steps_tokens_from_the_same_state():
    generator = _same_state(5)
    result = compare_step(LOGITS, IDS, SETTINGS, generator=generator, do_sample=True, temperature=0.9)
    assert isinstance(result, StepComparison) and list(result.tokens) == list(SETTINGS)
    for name, setting in SETTINGS.items():
        expected = sample_step(LOGITS, IDS, generator=_same_state(5), do_sample=True, **{"temperature": 0.9,
                                                                                           **setting})
        assert torch.equal(result.tokens[name], expected), name
        assert result.traces[name].token == int(expected[0])
    assert result.settings["top-p"] == dict(do_sample=True, temperature=0.9, top_p=0.9)  # common, then its own
    # the generator is left where the first setting left it
    first = _same_state(5)
    sample_step(LOGITS, IDS, generator=first, do_sample=True, temperature=0.9, top_p=0.9)
    assert torch.equal(generator.get_state(), first.get_state())


def test_one_generator_per_row_and_the_global_generator_are_replayed():
    settings = {"top-k": dict(top_k=5), "per-row min-p": dict(min_p=[0.1, 0.0, 0.2, 0.05])}
    generators = [_same_state(row) for row in range(4)]
    result = compare_step(LOGITS, IDS, settings, generator=generators, do_sample=True)
    for name, setting in settings.items():
        expected = sample_step(LOGITS, IDS, generator=[_same_state(row) for row in range(4)], do_sample=True,
                               **setting)
        assert torch.equal(result.tokens[name], expected), name
    torch.manual_seed(3)
    result = compare_step(LOGITS, IDS, settings, do_sample=True)
    for name, setting in settings.items():
        torch.manual_seed(3)
        assert torch.equal(result.tokens[name], sample_step(LOGITS, IDS, do_sample=True, **setting)), name


def test_where_the_chains_agree_the_draws_agree():
    """Settings that leave a row the same distribution draw the same token in that row, on every seed;
    a row whose distribution differs may not."""
    settings = {"plain": {}, "top-k V": dict(top_k=V), "top-p 1": dict(top_p=1.0),
                "row 2 only": dict(top_k=[V, V, 3, V])}
    for seed in range(20):
        result = compare_step(LOGITS, IDS, settings, generator=_same_state(seed), do_sample=True)
        tokens = [result.tokens[name].tolist() for name in settings]
        assert all(t == tokens[0] for t in tokens[:3])
        assert [t for i, t in enumerate(tokens[3]) if i != 2] == [t for i, t in enumerate(tokens[0]) if i != 2]
        assert result.first_difference in (0, None)
        assert (result.first_difference is None) == (tokens[3] == tokens[0])


def test_differences_by_hand():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])  # token i is the i-th most likely
    result = compare_step(logits, None, {"k1": dict(top_k=1), "k3": dict(top_k=3), "p": dict(top_p=0.9)})
    assert result.kept("k1") == [0] and result.kept("k3") == [0, 1, 2]
    assert result.kept("p") == [0, 1, 2]  # softmax: 0.636, 0.234, 0.086 (0.956 >= 0.9), 0.032, 0.012
    (k1, k3, p) = result.differences
    assert (k1.setting, k1.stage, k1.label, k1.removed) == ("k1", 1, "TopKLogitsWarper(top_k=1)", [1, 2, 3, 4])
    assert k1.kept_by == {"k3": [1, 2], "p": [1, 2]}
    assert k3.removed == [3, 4] and k3.kept_by == {"k1": [], "p": []}
    assert p.removed == [3, 4]
    assert result.first_difference is None  # greedy: all three take token 0
    text = str(result)
    assert "TopKLogitsWarper(top_k=1): changed 4 scores, removed 4, 1 left\n        that k3 keeps: #1, #2" in text


def test_why_they_part_by_hand():
    """The stage that moved the chosen tokens, with their probabilities before and after it."""
    logits, ids = torch.tensor([[3.0, 2.0, 1.0, 0.0]]), torch.tensor([[0]])
    result = compare_step(logits, ids, {"plain": dict(top_k=0), "penalty": dict(repetition_penalty=4.0, top_k=0)})
    assert result.tokens["plain"].tolist() == [0] and result.tokens["penalty"].tolist() == [1]  # 3 / 4 < 2
    before = torch.softmax(logits[0], -1)
    after = torch.softmax(torch.tensor([0.75, 2.0, 1.0, 0.0]), -1)
    ((t0, b0, a0), (t1, b1, a1)) = result.moves("penalty", 1)
    assert (t0, t1) == (0, 1)
    torch.testing.assert_close(torch.tensor([b0, a0, b1, a1]), torch.stack([before[0], after[0], before[1], after[1]]))
    assert f"'#0' p {b0:.3f} -> {a0:.3f}".replace("'", "") in str(result)
    model = TinyRecompute(TinyCore(vocab=45, max_len=64))
    race = compare_generation(model, torch.tensor([[5, 9, 13, 2]]), {"a": {}, "b": dict(repetition_penalty=50.0)},
                              max_new_tokens=6)
    step = race.first_difference
    assert step is not None
    (other, token, p), = race.others_chosen("a", step)
    assert (other, token) == ("b", int(race.tokens["b"][0, 4 + step]))
    assert p == pytest.approx(float(torch.softmax(race.outputs["a"].scores[step][0], -1)[token]))


def test_compare_step_html_is_side_by_side_and_escaped():
    tokenizer = char_tokenizer()
    logits = torch.randn(1, len(tokenizer), generator=_same_state(0))
    result = compare_step(logits, None, {"<b>top-p</b>": dict(top_p=0.5), "min-p": dict(min_p=0.2)},
                          tokenizer=tokenizer, generator=_same_state(1), do_sample=True)
    html = result._repr_html_()
    assert html.startswith("<div class='hfbridge-compare'") and "<b>" not in html and "&lt;b&gt;top-p" in html
    assert "grid-template-columns:repeat(2," in html and "color-scheme:only light" in html
    assert html.count("removed ") >= 1 and "line-through" in html
    page = result.to_html()
    assert page.startswith("<!DOCTYPE html>") and html in page


def _model():
    return TinyRecompute(TinyCore(vocab=45, max_len=64))


def test_each_setting_gives_generates_tokens_from_the_same_state():
    model, tokenizer = _model(), char_tokenizer()
    prompt = torch.tensor([[5, 9, 13, 2], [7, 7, 3, 11]])
    settings = {"top-p": dict(top_p=0.9), "min-p": dict(min_p=0.05),
                "per-row": dict(temperature=[0.7, 1.3], repetition_penalty=[1.0, 1.4]),
                "DRY": dict(dry_multiplier=0.8, dry_allowed_length=1), "greedy": dict(do_sample=False)}
    result = compare_generation(model, prompt, settings, max_new_tokens=12, generator=_same_state(4),
                                tokenizer=tokenizer, do_sample=True, pad_token_id=1)
    assert isinstance(result, GenerationComparison)
    for name, setting in settings.items():
        expected = generate(model, prompt, max_new_tokens=12, generator=_same_state(4), tokenizer=tokenizer,
                            **{"do_sample": True, "pad_token_id": 1, **setting})
        assert torch.equal(result.tokens[name], expected), name
    # by hand: the first generated step where any row of any two settings differs
    new = [result.tokens[name][:, 4:] for name in settings]
    differs = [step for step in range(12) if any(not torch.equal(t[:, step], new[0][:, step]) for t in new)]
    assert result.first_difference == differs[0]
    step = result.row_difference
    assert step is not None and step >= result.first_difference
    for name in settings:
        allowed = torch.nonzero(result.outputs[name].scores[step][0] > float("-inf")).flatten().tolist()
        assert sorted(result.candidates(name, step)) == allowed
    assert result.text("top-p", step) == tokenizer.decode(result.tokens["top-p"][0, 4 + step:])


def test_same_chain_same_generation_and_the_html_of_a_long_one():
    model = _model()
    prompt = torch.tensor([[5, 9, 13, 2]])
    result = compare_generation(model, prompt, {"a": dict(top_k=0), "b": dict(top_p=1.0)}, max_new_tokens=50,
                                generator=_same_state(0), do_sample=True)
    assert torch.equal(result.tokens["a"], result.tokens["b"]) and result.first_difference is None
    assert "every setting generated the same 50 tokens" in str(result)
    long = compare_generation(model, prompt, {"t 0.5": dict(temperature=0.5), "t 2": dict(temperature=2.0)},
                              max_new_tokens=58, generator=_same_state(0), do_sample=True)
    html = long._repr_html_()
    assert long.first_difference is not None and "max-height:28em;overflow-y:auto" in html
    assert len(re.findall(r"title='step \d+: p=", html)) == 2 * (58 - long.first_difference)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: compare_step(LOGITS, IDS, [dict(top_p=0.9)]), TypeError,
     r"^compare_step: `settings` must be a non-empty mapping of names to option mappings \(\{'top-p': "
     r"dict\(top_p=0\.9\), 'min-p': dict\(min_p=0\.05\)\}\), got list\.$"),
    (lambda: compare_step(LOGITS, IDS, {}), TypeError, r"got dict \(empty\)\.$"),
    (lambda: compare_step(LOGITS, IDS, {"a": 0.9}), TypeError,
     r"^compare_step: settings\['a'\] must be a mapping of options \(dict\(top_p=0.9\)\), got float\.$"),
    (lambda: compare_step(LOGITS, IDS, {"a": dict(generator=torch.Generator())}), TypeError,
     r"^compare_step: settings\['a'\] sets `generator`, which is the comparison's own argument \(one for every "
     r"setting\): pass it to compare_step\(\) itself\.$"),
    (lambda: compare_step(LOGITS, IDS, {"a": {}}, generator="seed"), TypeError,
     r"^`generator` must be a torch.Generator, a list of them \(one per row\) or None, got str\.$"),
    (lambda: compare_step(LOGITS, IDS, {"a": dict(top_p="high")}), TypeError, r"^`top_p` must be a number, got str"),
    (lambda: compare_generation(_model(), torch.tensor([[1, 2]]), {"beams": dict(num_beams=2)}, max_new_tokens=2),
     ValueError, r"^compare_generation: settings\['beams'\] sets `num_beams`; the comparison runs greedy search "
                 r"and sampling"),
])
def test_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize(("setting", "named"), [
    (dict(num_beams=2), "num_beams"),
    (dict(num_beams=1, num_beam_groups=2), "num_beam_groups"),
    (dict(penalty_alpha=0.6, top_k=4), "penalty_alpha"),
    (dict(prompt_lookup_num_tokens=2), "prompt_lookup_num_tokens"),
    (dict(dola_layers="low"), "dola_layers"),
    (dict(streamer=object()), "streamer"),
])
def test_generation_refuses_every_other_strategy(setting, named):
    """Every option the registry says selects another strategy (`selects`), read from the rows, and a streamer."""
    message = rf"^compare_generation: settings\['s'\] sets `{named}`; the comparison runs greedy search and sampling"
    with pytest.raises(ValueError, match=message):
        compare_generation(_model(), torch.tensor([[1, 2]]), {"s": setting}, max_new_tokens=2)


def test_generation_leaves_a_bad_strategy_value_to_generate():
    with pytest.raises(TypeError, match=r"^`num_beams` must be an int >= 1, got str 'two'\.$"):
        compare_generation(_model(), torch.tensor([[1, 2]]), {"s": dict(num_beams="two")}, max_new_tokens=2)


def test_the_callers_tensors_are_untouched():
    logits, ids = LOGITS.clone(), IDS.clone()
    compare_step(logits, ids, {"a": dict(repetition_penalty=2.0), "b": dict(top_k=2)}, generator=_same_state(0))
    assert torch.equal(logits, LOGITS) and torch.equal(ids, IDS)


def test_one_colour_language_that_forced_dark_mode_leaves_alone():
    """Every view's card opts out of forced dark mode; the chosen token is blue everywhere (orange is the
    probability scale's long shot); a penalty window's `repetition_penalty` of 1 is not listed."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    from hfbridge import explain_generation, explain_step

    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    step = explain_step(logits, torch.tensor([[1, 2]]), presence_penalty=0.5, penalty_last_n=-1)._repr_html_()
    out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[0, 1]]), scores=(torch.zeros(1, 3),))
    views = [step, explain_generation(out)._repr_html_(),
             compare_step(logits, None, {"a": {}, "b": dict(top_k=1)})._repr_html_()]
    for html in views:
        assert re.match(r"<div class='hfbridge-\w+' style='[^']*color-scheme:only light;forced-color-adjust:none",
                        html), html[:200]
    assert "outline:2px solid #0969da" in step and "#fdd0a2" not in step and "#e6550d" not in step
    assert "presence_penalty=0.5" in step and "repetition_penalty" not in step
