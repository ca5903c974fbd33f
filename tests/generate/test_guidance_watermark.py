"""Watermarking (`watermarking_config=`, both kinds) and classifier-free guidance (`guidance_scale=`).

Parity: `hfbridge.generate` through each model form (Recompute, ReturnsCache, InputPos, Hooks)
returns the tokens of HF's own `model.generate` with the same options and seed, on tiny random
HF models. Detection: HF's `WatermarkDetector` finds the green-list watermark in hfbridge's output
of a non-HF model, and SynthID's g-values (HF's processor scores them) stand out. The model calls
of guidance are counted against HF's. Bad input is refused before any model call.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import (
    LogitsProcessorList,
    PretrainedConfig,
    SynthIDTextWatermarkingConfig,
    WatermarkDetector,
    WatermarkingConfig,
)
from transformers.generation.logits_process import UnbatchedClassifierFreeGuidanceLogitsProcessor

from hfbridge import (
    Hooks,
    InputPos,
    Recompute,
    ReturnsCache,
    Sampler,
    build_processors,
    explain_step,
    generate,
    sample_step,
)
from hfbridge._step.plan.processor_repr import processor_label

from _tiny_models import (
    InputPosHF,
    TinyCore,
    TinyRecompute,
    model_cache,
    positions,
    recompute_callable,
    returns_cache_callable,
)

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

MAX_NEW = 8
PADDED = (torch.tensor([[5, 9, 13, 2, 7, 21], [0, 0, 0, 3, 4, 11]]), torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]]))
UNPADDED = (torch.tensor([[5, 9, 13, 2, 7, 21], [40, 3, 3, 18, 4, 11]]), torch.ones(2, 6, dtype=torch.long))
NEGATIVE = torch.tensor([[7, 7, 8], [9, 10, 11]])
SYNTHID = dict(ngram_len=3, keys=[654, 400, 836, 123, 340])

WATERMARKS = {
    "green_greedy": dict(do_sample=False, watermarking_config=WatermarkingConfig(bias=3.0)),
    "green_selfhash_sample": dict(do_sample=True, top_k=10, watermarking_config=WatermarkingConfig(
        bias=3.0, seeding_scheme="selfhash", context_width=2)),
    "green_dict_sample": dict(do_sample=True, watermarking_config={"bias": 2.5, "greenlist_ratio": 0.5}),
    "synthid_sample": dict(do_sample=True, watermarking_config=SynthIDTextWatermarkingConfig(**SYNTHID)),
    "synthid_greedy_top_k": dict(do_sample=False, watermarking_config=SynthIDTextWatermarkingConfig(**SYNTHID)),
}
GUIDANCE = {
    "greedy": dict(do_sample=False, guidance_scale=1.7),
    "sample_negative": dict(do_sample=True, guidance_scale=2.5, negative_prompt_ids=NEGATIVE),
    "sample_negative_mask": dict(do_sample=True, top_p=0.9, guidance_scale=2.5, negative_prompt_ids=NEGATIVE,
                                 negative_prompt_attention_mask=torch.ones_like(NEGATIVE)),
    "num_return_sequences": dict(do_sample=True, guidance_scale=4.0, num_return_sequences=2),
    "with_watermark": dict(do_sample=True, guidance_scale=5.0, watermarking_config=WatermarkingConfig()),
    "beam": dict(do_sample=False, guidance_scale=1.5, num_beams=2),
}

_model = model_cache()


def _hooks(hf):
    """HF's `prepare_inputs_for_generation` / cache update, as `Hooks`."""
    def prepare_inputs(input_ids, attention_mask, past_key_values=None):
        fed = 0 if past_key_values is None else _cached_length(past_key_values)
        return {"input_ids": input_ids[:, fed:], "attention_mask": attention_mask, "use_cache": True,
                "position_ids": positions(attention_mask)[:, fed:], "past_key_values": past_key_values}

    def update_state(outputs, state):
        return {**state, "past_key_values": outputs.past_key_values}

    return Hooks(hf, prepare_inputs, update_state)


def _cached_length(cache):
    return cache.get_seq_length() if hasattr(cache, "get_seq_length") else cache[0][0].shape[2]


FORMS = {  # name -> (adapter factory, HF's use_cache, prompts)
    "recompute": (lambda hf: Recompute(recompute_callable(hf)), False, PADDED),
    "returns_cache": (lambda hf: ReturnsCache(returns_cache_callable(hf)), True, PADDED),
    "input_pos": (lambda hf: InputPos(InputPosHF(hf)), True, UNPADDED),
    "hooks": (_hooks, True, PADDED),
}


def _run_both(model_name, form, options, **extra):
    hf = _model(model_name)
    make, use_cache, (prompt, mask) = FORMS[form]
    torch.manual_seed(1234)
    theirs = hf.generate(prompt, attention_mask=mask, use_cache=use_cache, max_new_tokens=MAX_NEW, **options)
    torch.manual_seed(1234)
    ours = generate(make(hf), prompt, attention_mask=mask, max_new_tokens=MAX_NEW, **options, **extra)
    return ours, theirs


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("model_name", ["gpt2", "llama"])
@pytest.mark.parametrize("case", WATERMARKS)
def test_watermark_matches_hf(case, model_name, form):
    ours, theirs = _run_both(model_name, form, WATERMARKS[case])
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"


def test_watermark_changes_tokens():
    """The parity above is not parity of two unwatermarked runs: the watermark moves tokens."""
    for case in WATERMARKS:
        options = dict(WATERMARKS[case])
        marked, _ = _run_both("llama", "recompute", options)
        options.pop("watermarking_config")
        plain, _ = _run_both("llama", "recompute", options)
        assert not torch.equal(marked, plain), case


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("model_name", ["gpt2", "llama"])
@pytest.mark.parametrize("case", GUIDANCE)
def test_guidance_matches_hf(case, model_name, form):
    options = GUIDANCE[case]
    extra = {}
    if form == "input_pos":
        if case == "beam":
            pytest.skip("beam search with an InputPos model needs reorder_cache (test_beam.py)")
        extra["unconditional_model"] = InputPos(InputPosHF(_model(model_name)))  # caches of its own
    ours, theirs = _run_both(model_name, form, options, **extra)
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"
    if "beam" not in case:
        plain, _ = _run_both(model_name, "recompute", {k: v for k, v in options.items() if k != "guidance_scale"})
        assert not torch.equal(ours, plain), "guidance changed nothing: the test would not see a wrong mix"


def test_guidance_scale_one_is_plain_generation():
    calls = []
    core = TinyCore(vocab=32)
    model = TinyRecompute(core)
    model.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape))
    prompt = torch.tensor([[3, 4, 5]])
    torch.manual_seed(0)
    guided = generate(model, prompt, max_new_tokens=6, do_sample=True, guidance_scale=1.0,
                      negative_prompt_ids=torch.tensor([[1, 2]]))
    assert len(calls) == 6
    torch.manual_seed(0)
    assert torch.equal(guided, generate(model, prompt, max_new_tokens=6, do_sample=True))


class _Counter:
    def __init__(self, module):
        self.shapes = []
        module.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        self.shapes.append(tuple(ids.shape))


@pytest.mark.parametrize("form", ["recompute", "returns_cache", "hooks"])
@pytest.mark.parametrize("negative", [False, True])
def test_guidance_makes_hfs_model_calls(form, negative):
    """One unconditional call per step, as HF's processor makes: the same count and the same shapes."""
    hf = _model("gpt2").__class__(_model("gpt2").config).eval()  # a fresh module, its own hooks
    hf.load_state_dict(_model("gpt2").state_dict())
    counter = _Counter(hf)
    make, use_cache, (prompt, mask) = FORMS[form]
    options = dict(max_new_tokens=5, do_sample=True, guidance_scale=2.0)
    if negative:
        options["negative_prompt_ids"] = NEGATIVE
    torch.manual_seed(3)
    theirs = hf.generate(prompt, attention_mask=mask, use_cache=use_cache, **options)
    hf_shapes, counter.shapes = counter.shapes, []
    torch.manual_seed(3)
    ours = generate(make(hf), prompt, attention_mask=mask, **options)
    assert torch.equal(ours, theirs)
    assert len(hf_shapes) == 2 * 5
    assert counter.shapes == hf_shapes


def test_green_list_watermark_detected_by_hf():
    """HF's `WatermarkDetector` (its model config built offline: the vocabulary size, and a BOS id it strips from the front)
    finds the watermark in a non-HF model's output, and not in the same model's unwatermarked output."""
    core = TinyCore(vocab=32, max_len=64)
    model = TinyRecompute(core)
    config = WatermarkingConfig(bias=4.0, greenlist_ratio=0.25)
    prompt = torch.tensor([[3, 4, 5, 6]] * 2)
    detector = WatermarkDetector(PretrainedConfig(vocab_size=32, bos_token_id=0), "cpu", config)
    torch.manual_seed(7)
    marked = generate(model, prompt, max_new_tokens=48, do_sample=True, watermarking_config=config)
    torch.manual_seed(7)
    plain = generate(model, prompt, max_new_tokens=48, do_sample=True)
    found = detector(marked[:, prompt.shape[1] - 1:], return_dict=True)
    missed = detector(plain[:, prompt.shape[1] - 1:], return_dict=True)
    assert found.prediction.all() and (found.z_score > 6).all(), found.z_score
    assert not missed.prediction.any(), missed.z_score


def test_synthid_g_values_stand_out():
    """SynthID's score is the mean g-value of the text's n-grams (HF's processor computes them): about
    0.5 without the watermark, clearly above with it."""
    core = TinyCore(vocab=32, max_len=64)
    model = TinyRecompute(core)
    config = SynthIDTextWatermarkingConfig(**SYNTHID)
    prompt = torch.tensor([[3, 4, 5, 6]] * 4)
    torch.manual_seed(5)
    marked = generate(model, prompt, max_new_tokens=48, do_sample=True, watermarking_config=config)
    torch.manual_seed(5)
    plain = generate(model, prompt, max_new_tokens=48, do_sample=True)
    scorer = config.construct_processor(32, "cpu")

    def mean_g(sequences):
        g = scorer.compute_g_values(sequences[:, prompt.shape[1]:]).float()  # [B, n-grams, depth]
        repeated = scorer.compute_context_repetition_mask(sequences[:, prompt.shape[1]:])  # [B, n-grams]
        return float((g.mean(-1) * repeated).sum() / repeated.sum())

    assert mean_g(marked) > 0.6 > 0.55 > mean_g(plain)


def test_sampler_synthid_over_steps_equals_generate():
    """A Sampler keeps SynthID's state from step to step: a hand-written loop gives generate's tokens."""
    core = TinyCore(vocab=32)
    model = TinyRecompute(core)
    config = SynthIDTextWatermarkingConfig(**SYNTHID)
    prompt = torch.tensor([[3, 4, 5], [7, 8, 9]])
    sampler = Sampler(watermarking_config=config, do_sample=True)
    torch.manual_seed(2)
    ids = prompt
    for _ in range(6):
        ids = torch.cat([ids, sampler(model(ids), ids)[:, None]], dim=1)
    torch.manual_seed(2)
    assert torch.equal(ids, generate(model, prompt, max_new_tokens=6, do_sample=True, watermarking_config=config))


def test_sample_step_guidance_is_hfs_mix():
    torch.manual_seed(0)
    logits, unconditional = torch.randn(2, 4, 32), torch.randn(2, 1, 32)
    ids = torch.randint(0, 32, (2, 4))
    before = (logits.clone(), unconditional.clone())
    hf = UnbatchedClassifierFreeGuidanceLogitsProcessor(2.0, lambda *a, **k: {"logits": unconditional})
    hf.get_unconditional_logits = lambda input_ids: unconditional
    expected = LogitsProcessorList([hf])(ids, logits[:, -1].clone()).argmax(-1)
    ours = sample_step(logits, ids, guidance_scale=2.0, unconditional_logits=unconditional)
    assert torch.equal(ours, expected)
    assert not torch.equal(ours, sample_step(logits, ids))
    assert torch.equal(logits, before[0]) and torch.equal(unconditional, before[1])
    # a Sampler takes a callable: the step's unconditional logits for the tokens so far
    sampler = Sampler(guidance_scale=2.0, unconditional=lambda input_ids: unconditional)
    assert torch.equal(sampler(logits, ids), expected)


def test_views_name_them():
    processors = build_processors(guidance_scale=1.5, unconditional=lambda ids: torch.zeros(1, 4), do_sample=True,
                                  top_k=3, watermarking_config=WatermarkingConfig(bias=1.5))
    labels = [processor_label(p) for p in processors]
    assert labels[0] == "UnbatchedClassifierFreeGuidanceLogitsProcessor(guidance_scale=1.5)"  # HF's first
    # HF's place: transformers 4.x builds the watermark before the sampling warpers, 5.x after them
    watermark = 1 if transformers.__version__.startswith("4.") else 2
    assert labels[watermark].startswith("WatermarkLogitsProcessor(greenlist_ratio=0.25, bias=1.5, hashing_key=15485863")
    assert len(labels) == 3
    synthid = build_processors(watermarking_config=SynthIDTextWatermarkingConfig(**SYNTHID))
    assert processor_label(synthid[0]).startswith("SynthIDTextWatermarkLogitsProcessor(ngram_len=3, keys=[654, 400")


# ----------------------------------------------------------------------------------------------
# Bad input: refused before any model call.
# ----------------------------------------------------------------------------------------------


def _never_called(input_ids):
    raise AssertionError("the model was called")


BAD = [
    (dict(guidance_scale="2"), TypeError, "`guidance_scale` must be a number, got str '2'."),
    (dict(guidance_scale=True), TypeError, "`guidance_scale` must be a number, got bool True."),
    (dict(guidance_scale=float("nan")), ValueError, "`guidance_scale` must be a finite number, got nan."),
    (dict(guidance_scale=float("inf")), ValueError, "`guidance_scale` must be a finite number, got inf."),
    (dict(guidance_scale=2.0, negative_prompt_ids=NEGATIVE.float()), TypeError,
     "`negative_prompt_ids` must hold integer token ids, got dtype torch.float32."),
    (dict(guidance_scale=2.0, negative_prompt_ids=NEGATIVE[0]), ValueError,
     "`negative_prompt_ids` must be (batch, seq) with one row per prompt (2) and at least one token, got shape (3,)."),
    (dict(guidance_scale=2.0, negative_prompt_ids=NEGATIVE[:1]), ValueError,
     "`negative_prompt_ids` must be (batch, seq) with one row per prompt (2) and at least one token, got shape (1, 3)."),
    (dict(guidance_scale=2.0, negative_prompt_ids=[[1, 2]]), TypeError,
     "`negative_prompt_ids` must be a (batch, seq) tensor of token ids, got list."),
    (dict(guidance_scale=2.0, negative_prompt_ids=NEGATIVE, negative_prompt_attention_mask=torch.ones(2, 2,
                                                                                                      dtype=torch.long)),
     ValueError, "`negative_prompt_attention_mask` must have the shape of `negative_prompt_ids` (2, 3), got (2, 2)."),
    (dict(guidance_scale=2.0, negative_prompt_ids=NEGATIVE, negative_prompt_attention_mask=torch.ones(2, 3)),
     TypeError, "`negative_prompt_attention_mask` must hold integers 0/1 (or bools), got dtype torch.float32."),
    (dict(guidance_scale=2.0, negative_prompt_attention_mask=torch.ones(2, 3, dtype=torch.long)), ValueError,
     "`negative_prompt_attention_mask` was given without `negative_prompt_ids`"),
    (dict(watermarking_config="green"), TypeError,
     "`watermarking_config` must be a transformers.WatermarkingConfig, a SynthIDTextWatermarkingConfig or a dict of "
     "WatermarkingConfig's arguments, got str."),
    (dict(watermarking_config=SynthIDTextWatermarkingConfig(ngram_len=3, keys="654, 400")), TypeError,
     "`watermarking_config.keys` must be a non-empty list of int keys (one per depth), got str '654, 400'."),
    (dict(watermarking_config=SynthIDTextWatermarkingConfig(ngram_len=3, keys=[654, 4.5])), TypeError,
     "`watermarking_config.keys[1]` must be an int, got float 4.5."),
    (dict(watermarking_config=SynthIDTextWatermarkingConfig(ngram_len=3, keys=torch.tensor([1, 2]))), TypeError,
     "`watermarking_config.keys` must be a non-empty list of int keys (one per depth), got Tensor"),
    (dict(watermarking_config=SynthIDTextWatermarkingConfig(ngram_len=1, keys=[1])), ValueError,
     "`watermarking_config.ngram_len` must be an int >= 2, got 1."),
    (dict(watermarking_config=WatermarkingConfig(greenlist_ratio=0.0)), ValueError,
     "`watermarking_config.greenlist_ratio` must lie strictly between 0 and 1"),
    (dict(watermarking_config=WatermarkingConfig(bias=float("nan"))), ValueError,
     "`watermarking_config.bias` must be a finite number, got nan."),
    (dict(watermarking_config=WatermarkingConfig(context_width=0)), ValueError,
     "`watermarking_config.context_width` must be an int >= 1, got 0."),
    (dict(watermarking_config={"bias": 2.0, "gamma": 0.5}), TypeError,
     "`watermarking_config` as a dict takes WatermarkingConfig's arguments"),
]


@pytest.mark.parametrize(("options", "kind", "message"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_refused_before_any_model_call(options, kind, message):
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(kind) as error:
        generate(_never_called, prompt, max_new_tokens=2, **options)
    assert message in str(error.value)


def test_negative_prompt_checked_when_scale_is_one():
    with pytest.raises(TypeError, match="`negative_prompt_ids` must hold integer token ids"):
        generate(_never_called, torch.tensor([[1, 2]]), max_new_tokens=2, guidance_scale=1.0,
                 negative_prompt_ids=torch.tensor([[0.5]]))


def test_refusals_say_what_to_do():
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"Pass unconditional_model=InputPos\(second_model\)"):
        generate(InputPos(lambda idx, input_pos: _never_called(idx)), prompt, max_new_tokens=2, guidance_scale=2.0)
    with pytest.raises(TypeError, match="`unconditional_model`: `model` must be callable"):
        generate(_never_called, prompt, max_new_tokens=2, guidance_scale=2.0, unconditional_model=3)
    same = InputPos(lambda idx, input_pos: _never_called(idx))
    with pytest.raises(ValueError, match="`unconditional_model` must have its own cache"):
        generate(same, prompt, max_new_tokens=2, guidance_scale=2.0, unconditional_model=same)
    with pytest.raises(ValueError, match="with assisted / prompt-lookup decoding is not supported"):
        generate(_never_called, prompt, max_new_tokens=2, guidance_scale=2.0, prompt_lookup_num_tokens=2)
    with pytest.raises(ValueError, match=r"needs the unconditional logits.*sample_step\(logits, input_ids, "
                                         r"guidance_scale=\.\.\., unconditional_logits="):
        Sampler(guidance_scale=2.0)
    with pytest.raises(ValueError, match="`guidance_scale`=2.0 needs the unconditional"):
        build_processors(guidance_scale=2.0)
    with pytest.raises(ValueError, match="Build a Sampler\\(watermarking_config=...\\) once"):
        sample_step(torch.zeros(1, 8), watermarking_config=SynthIDTextWatermarkingConfig(**SYNTHID))
    with pytest.raises(TypeError, match="`unconditional_logits` must be a tensor"):
        sample_step(torch.zeros(1, 8), guidance_scale=2.0, unconditional_logits="zeros")
    with pytest.raises(ValueError, match=r"the unconditional logits give \(3, 8\) \(rows, vocab\), but the "
                                         r"conditional scores are \(1, 8\)"):
        sample_step(torch.zeros(1, 8), guidance_scale=2.0, unconditional_logits=torch.zeros(3, 8))


def test_unconditional_model_error_names_the_branch():
    calls = []

    def model(input_ids):
        calls.append(input_ids.shape)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return torch.zeros(input_ids.shape[0], input_ids.shape[1], 8)

    with pytest.raises(RuntimeError, match="boom") as error:
        generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=2, guidance_scale=2.0)
    assert any("unconditional sequence of guidance_scale" in note for note in error.value.__notes__)


def test_explain_step_names_them_and_chooses_sample_steps_token():
    torch.manual_seed(0)
    logits, unconditional = torch.randn(1, 3, 32), torch.randn(1, 3, 32)
    ids = torch.tensor([[4, 5, 6]])
    options = dict(guidance_scale=3.0, unconditional_logits=unconditional, top_k=4, do_sample=False,
                   watermarking_config=WatermarkingConfig(bias=2.0))
    trace = explain_step(logits, ids, **options)
    names = [stage.name for stage in trace.stages]
    assert names[:2] == ["input", "UnbatchedClassifierFreeGuidanceLogitsProcessor"]
    assert "WatermarkLogitsProcessor" in names
    assert trace.stages[1].params == {"guidance_scale": 3.0}
    assert trace.token == int(sample_step(logits, ids, **options)[0])


def test_guidance_and_watermark_with_padded_vocabulary_and_another_layout():
    """The unconditional logits go through the conditional ones' layout and `vocab_size`: a model
    padding its vocabulary with huge scores, time-major, gives the tokens of the plain model."""
    core = TinyCore(vocab=32)
    model = TinyRecompute(core)

    def padded_time_major(input_ids):  # [B, T] -> [T, B, 40]
        logits = model(input_ids)
        return torch.cat([logits, torch.full((*logits.shape[:2], 8), 1e4)], dim=-1).transpose(0, 1)

    prompt, negative = torch.tensor([[3, 4, 5], [6, 7, 8]]), torch.tensor([[1, 2], [9, 9]])
    negative_before = negative.clone()
    options = dict(max_new_tokens=6, do_sample=True, guidance_scale=2.5, negative_prompt_ids=negative,
                   watermarking_config=WatermarkingConfig(bias=1.0))
    torch.manual_seed(4)
    ours = generate(padded_time_major, prompt, layout="t b v", vocab_size=32, **options)
    torch.manual_seed(4)
    assert torch.equal(ours, generate(model, prompt, **options))
    assert torch.equal(negative, negative_before)


def test_unconditional_logits_of_another_vocabulary():
    def model(input_ids):  # the unconditional sequence (the negative prompt of 2 tokens) gets 7 columns
        return torch.zeros(input_ids.shape[0], input_ids.shape[1], 7 if input_ids.shape[1] == 2 else 8)

    with pytest.raises(ValueError, match=r"the unconditional logits give \(1, 7\) \(rows, vocab\), but the "
                                         r"conditional scores are \(1, 8\)"):
        generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=2, guidance_scale=2.0,
                 negative_prompt_ids=torch.tensor([[4, 5]]))


def test_scores_of_return_dict_and_options_from_a_generation_config():
    """`output_scores` holds HF's guided (and watermarked) scores; the options may come in a GenerationConfig."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, guidance_scale=3.0, max_new_tokens=MAX_NEW,
                              watermarking_config=SynthIDTextWatermarkingConfig(**SYNTHID))
    hf = _model("llama")
    prompt, mask = PADDED
    torch.manual_seed(9)
    theirs = hf.generate(prompt, attention_mask=mask, generation_config=config, return_dict_in_generate=True,
                         output_scores=True, negative_prompt_ids=NEGATIVE)
    torch.manual_seed(9)
    ours = generate(ReturnsCache(returns_cache_callable(hf)), prompt, attention_mask=mask, generation_config=config,
                    return_dict_in_generate=True, output_scores=True, negative_prompt_ids=NEGATIVE)
    assert torch.equal(ours.sequences, theirs.sequences)
    assert len(ours.scores) == len(theirs.scores) == MAX_NEW
    for mine, hfs in zip(ours.scores, theirs.scores):
        torch.testing.assert_close(mine, hfs)
