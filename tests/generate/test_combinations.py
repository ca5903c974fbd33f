"""`generate` where features meet: options x strategies, each result HF's or a plain reference's, or a clear error.

The draft of assisted decoding with the community samplers' options; per-row values (HF's and the
community samplers') expanded per prompt or refused like HF's; options in a model's own
`generation_config` checked like keywords; the negative prompt checked against the vocabulary;
HF's `logits_processor=` and a `generation_config=` with keyword options as HF takes them.
"""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch
import transformers
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation.utils import GenerationMixin
from transformers.utils import logging as hf_logging

from hfbridge import Recompute, ReturnsCache, generate
from hfbridge.processors import DRYLogitsProcessor

from _tiny_models import model_cache, positions, recompute_callable

pytestmark = pytest.mark.usefixtures("one_thread")

_model = model_cache()
TABLE = torch.randn(48, 48, generator=torch.Generator().manual_seed(0))
DRAFT_TABLE = TABLE + 1.5 * torch.randn(48, 48, generator=torch.Generator().manual_seed(1))  # disagrees often
PROMPT = torch.tensor([[5, 7, 9, 11, 5, 7, 9, 30]])


class Counting:
    """A bigram model that counts its calls."""

    def __init__(self, table=TABLE):
        self.table, self.calls = table, 0

    def __call__(self, input_ids):
        self.calls += 1
        return self.table[input_ids]


def all_logits_cached(hf):
    """`model(input_ids, cache, attention_mask) -> (logits, cache)`, every fed position's logits."""
    def model(input_ids, cache, attention_mask):
        position_ids = positions(attention_mask)[:, -input_ids.shape[1]:]
        out = hf(input_ids, past_key_values=cache, attention_mask=attention_mask, position_ids=position_ids,
                 use_cache=True)
        return out.logits, out.past_key_values

    return ReturnsCache(model)


def all_logits_recompute(hf):
    def model(input_ids, attention_mask):
        return hf(input_ids, attention_mask=attention_mask, position_ids=positions(attention_mask),
                  use_cache=False).logits

    return Recompute(model)


def _hf_generate(hf, prompt, *, assistant=None, draft=None, seed=0, **options):
    """HF's own generate; the draft options go where HF reads them, the assistant's generation_config."""
    saved = None if assistant is None else copy.deepcopy(assistant.generation_config)
    if assistant is not None:
        assistant.generation_config.update(**(draft or {}))
    try:
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return hf.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=assistant, **options)
    finally:
        if assistant is not None:
            assistant.generation_config = saved


# ------------------------------------------------------------------------------------------
# Assisted decoding with the community samplers' options: the draft builds nothing twice
# ------------------------------------------------------------------------------------------

COMMUNITY = {
    "dry": dict(dry_multiplier=1.0, dry_sequence_breakers=[]),
    "presence": dict(presence_penalty=1.5, frequency_penalty=0.5),
    "dry_and_penalties": dict(dry_multiplier=0.8, dry_allowed_length=1, dry_sequence_breakers=[[9]],
                              presence_penalty=0.7, repetition_penalty=1.3, penalty_last_n=4),
}


@pytest.mark.parametrize("draft", ["model", "lookup"])
@pytest.mark.parametrize("options", sorted(COMMUNITY))
def test_assisted_greedy_with_community_options_is_the_plain_run(options, draft):
    extra = dict(assistant_model=Counting(DRAFT_TABLE)) if draft == "model" else dict(prompt_lookup_num_tokens=3)
    plain = generate(Counting(), PROMPT, max_new_tokens=12, **COMMUNITY[options])
    assisted = generate(Counting(), PROMPT, max_new_tokens=12, **COMMUNITY[options], **extra)
    assert torch.equal(assisted, plain)


def test_assisted_greedy_with_dry_and_a_tokenizer_is_the_plain_run():
    from _tiny_models import char_tokenizer

    tokenizer = char_tokenizer()  # DRY's default breakers are strings: the draft needs the tokenizer too
    plain = generate(Counting(), PROMPT, max_new_tokens=10, dry_multiplier=1.0, tokenizer=tokenizer)
    assisted = generate(Counting(), PROMPT, max_new_tokens=10, dry_multiplier=1.0, tokenizer=tokenizer,
                        assistant_model=Counting(DRAFT_TABLE))
    assert torch.equal(assisted, plain)


def test_assisted_sampling_with_dry_is_hfs_with_the_processor_passed():
    # HF's generate takes DRY as a processor of the user's; its place in the chain is the option's here
    target, assistant = _model("gpt2"), _model("llama")
    draft = dict(num_assistant_tokens=4, assistant_confidence_threshold=0.0)
    dry = DRYLogitsProcessor(0.8, 1.75, 1, -1, [])
    theirs = _hf_generate(target, PROMPT, assistant=assistant, draft=draft, seed=5, max_new_tokens=14,
                          do_sample=True, top_k=12, logits_processor=LogitsProcessorList([dry]))
    torch.manual_seed(5)
    ours = generate(all_logits_cached(target), PROMPT, assistant_model=all_logits_recompute(assistant),
                    max_new_tokens=14, do_sample=True, top_k=12, dry_multiplier=0.8, dry_allowed_length=1,
                    dry_sequence_breakers=[], **draft)
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"


# ------------------------------------------------------------------------------------------
# Per-row values: one per prompt, expanded like HF's, or refused like HF's
# ------------------------------------------------------------------------------------------

REFUSED = ("generate(): `{name}` per row works with greedy decoding and sampling, not with {strategy}; pass a "
           "single value (and a single generator).")


@pytest.mark.parametrize("name", ["presence_penalty", "repetition_penalty", "top_n_sigma", "dry_multiplier"])
def test_per_row_values_with_beams_are_refused_before_any_call(name):
    model = Counting()
    values = [1.0, 2.0] if name != "presence_penalty" else [0.0, 5.0]
    with pytest.raises(ValueError, match=None) as caught:
        generate(model, torch.tensor([[1, 2], [3, 4]]), max_new_tokens=3, num_beams=2, **{name: values})
    assert str(caught.value) == REFUSED.format(name=name, strategy="beam search")
    assert model.calls == 0


def test_community_per_row_values_with_assisted_decoding_are_refused():
    model = Counting()
    with pytest.raises(ValueError) as caught:
        generate(model, PROMPT, max_new_tokens=3, presence_penalty=[0.5], prompt_lookup_num_tokens=2)
    assert str(caught.value) == REFUSED.format(name="presence_penalty",
                                               strategy="assisted / prompt-lookup decoding")
    assert model.calls == 0


@pytest.mark.parametrize("options", [
    dict(top_n_sigma=[1.0, 2.0]),
    dict(presence_penalty=[0.0, 3.0], frequency_penalty=[1.0, 0.0]),
    dict(repetition_penalty=[1.0, 1.8], top_n_sigma=[2.0, 0.5]),
    dict(temperature=[0.7, 1.3], dry_multiplier=[0.0, 2.0], dry_allowed_length=1, dry_sequence_breakers=[]),
])
def test_per_row_values_are_one_per_prompt_with_num_return_sequences(options):
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    seeds = [11, 12, 13, 14]
    ours = generate(Counting(), prompts, max_new_tokens=6, do_sample=True, num_return_sequences=2,
                    generator=[torch.Generator().manual_seed(s) for s in seeds], **options)
    for prompt in range(2):  # each prompt alone, its own scalar values and its rows' generators
        scalars = {name: value[prompt] if isinstance(value, list) and name != "dry_sequence_breakers" else value
                   for name, value in options.items()}
        alone = generate(Counting(), prompts[prompt:prompt + 1], max_new_tokens=6, do_sample=True,
                         num_return_sequences=2, generator=[torch.Generator().manual_seed(s)
                                                            for s in seeds[2 * prompt:2 * prompt + 2]], **scalars)
        assert torch.equal(ours[2 * prompt:2 * prompt + 2], alone), (prompt, options)


def test_a_per_row_value_per_returned_sequence_is_refused_before_any_call():
    model = Counting()
    with pytest.raises(ValueError) as caught:
        generate(model, torch.tensor([[1, 2], [3, 4]]), max_new_tokens=3, do_sample=True, num_return_sequences=2,
                 top_n_sigma=[1.0, 2.0, 1.0, 2.0])
    assert str(caught.value) == ("`top_n_sigma` has 4 values, one per row, but `input_ids` has 2 rows; pass one value "
                                 "per row, or a single number for every row.")
    assert model.calls == 0


def test_per_row_values_in_a_generation_config_are_expanded_too():
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    config = GenerationConfig(do_sample=True, presence_penalty=[0.0, 4.0], max_new_tokens=5, num_return_sequences=2)
    ours = generate(Counting(), prompts, generation_config=config,
                    generator=[torch.Generator().manual_seed(s) for s in range(4)])
    keywords = generate(Counting(), prompts, max_new_tokens=5, do_sample=True, num_return_sequences=2,
                        presence_penalty=[0.0, 4.0], generator=[torch.Generator().manual_seed(s) for s in range(4)])
    assert torch.equal(ours, keywords)
    assert config.presence_penalty == [0.0, 4.0]  # the caller's config is never modified


# ------------------------------------------------------------------------------------------
# A model's own generation_config: its options checked like keywords
# ------------------------------------------------------------------------------------------

@pytest.fixture
def llama_with_config():
    hf = _model("llama")
    saved = copy.deepcopy(hf.generation_config)
    yield hf
    hf.generation_config = saved


@pytest.mark.parametrize(("attributes", "message"), [
    (dict(do_sample=True, mirostat=3),
     "`mirostat` must be 0 (off), 1 (mirostat 1.0) or 2 (mirostat 2.0), got 3"),
    (dict(do_sample=True, top_n_sigma=float("nan")), "`top_n_sigma` must be a finite number, got nan"),
    (dict(do_sample=True, smoothing_factor=-1.0), "`smoothing_factor` must be >= 0.0, got -1.0"),
    (dict(dry_multiplier="high"), "`dry_multiplier` must be a number, got str 'high'"),
    (dict(do_sample=True, dynatemp_range=-0.5), "`dynatemp_range` must be >= 0.0, got -0.5"),
])
def test_bad_options_in_a_models_generation_config_name_the_option(llama_with_config, attributes, message):
    hf = llama_with_config
    hf.generation_config = GenerationConfig(**attributes)
    with pytest.raises((ValueError, TypeError)) as caught:
        generate(hf, torch.tensor([[1, 2, 3]]), max_new_tokens=3)
    assert str(caught.value) == f"{message} (in the model's `generation_config`)."
    with pytest.raises(type(caught.value)) as passed:  # the same value in a passed config
        generate(Counting(), torch.tensor([[1, 2, 3]]), max_new_tokens=3, generation_config=GenerationConfig(
            **attributes))
    assert str(passed.value) == f"{message} (in `generation_config`)."


def test_a_models_generation_config_option_is_the_keyword(llama_with_config):
    hf = llama_with_config
    prompt = torch.tensor([[1, 2, 3]])
    hf.generation_config = GenerationConfig(do_sample=True, top_n_sigma=0.5, top_k=0)
    torch.manual_seed(0)
    from_config = generate(hf, prompt, max_new_tokens=8)
    hf.generation_config = GenerationConfig(do_sample=True, top_k=0)
    torch.manual_seed(0)
    keyword = generate(hf, prompt, max_new_tokens=8, top_n_sigma=0.5)
    torch.manual_seed(0)
    plain = generate(hf, prompt, max_new_tokens=8)
    assert torch.equal(from_config, keyword)
    assert not torch.equal(from_config, plain)  # the option did something


# ------------------------------------------------------------------------------------------
# Guidance: the negative prompt checked against the vocabulary as input_ids are
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("beams", [1, 2])
def test_negative_prompt_ids_outside_the_vocabulary_are_refused(beams):
    model = Counting()  # 48 tokens; the unconditional sequence is never fed
    with pytest.raises(ValueError) as caught:
        generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3, guidance_scale=1.5, num_beams=beams,
                 negative_prompt_ids=torch.tensor([[4, 50]]))
    assert str(caught.value) == ("generate(): at step 0: `negative_prompt_ids` hold token id 50, outside the vocabulary "
                                 "of 48 tokens (ids must be in [0, 48); vocab_size=None).")
    assert model.calls == 1  # the prompt's call, which told the vocabulary


def test_negative_prompt_ids_are_checked_against_vocab_size():
    with pytest.raises(ValueError, match=r"token id 20, outside the vocabulary of 20 tokens .*vocab_size=20\)"):
        generate(Counting(), torch.tensor([[1, 2, 3]]), max_new_tokens=3, guidance_scale=1.5, vocab_size=20,
                 negative_prompt_ids=torch.tensor([[20]]))


# ------------------------------------------------------------------------------------------
# HF's names at the boundary
# ------------------------------------------------------------------------------------------

def _boost(input_ids, scores):
    return scores + torch.arange(scores.shape[-1], dtype=scores.dtype) * 0.3


def test_logits_processor_is_processors():
    prompt = torch.tensor([[1, 2, 3]])
    by_hf_name = generate(Counting(), prompt, max_new_tokens=6, logits_processor=[_boost])
    assert torch.equal(by_hf_name, generate(Counting(), prompt, max_new_tokens=6, processors=[_boost]))
    assert not torch.equal(by_hf_name, generate(Counting(), prompt, max_new_tokens=6))
    assert torch.equal(by_hf_name, generate(Counting(), prompt, max_new_tokens=6, processors=[_boost],
                                            logits_processor=None))  # HF's default, not a second list
    model = Counting()
    with pytest.raises(TypeError) as caught:
        generate(model, prompt, max_new_tokens=3, processors=[_boost], logits_processor=[_boost])
    assert str(caught.value) == ("generate() got both `processors=` and `logits_processor=` (HF's name for the same "
                                 "argument); pass your logits processors once.")
    assert model.calls == 0


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def hf_log():
    logger = hf_logging.get_logger("transformers")
    handler, verbosity = _Records(), hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    logger.addHandler(handler)
    hf_logging.warning_once.cache_clear()  # logged once per process: a test before must not hide it
    yield handler.messages
    logger.removeHandler(handler)
    hf_logging.set_verbosity(verbosity)


def test_a_generation_config_with_keyword_options_merges_without_the_deprecation(hf_log):
    prompt = torch.tensor([[1, 2, 3]])
    # HF's own merge logs the deprecation for this call (the test would see it)
    GenerationMixin._prepare_generation_config(_model("gpt2"), GenerationConfig(max_new_tokens=4), top_k=3)
    if int(transformers.__version__.split(".")[0]) >= 5:  # transformers 4.x merges without that message
        assert any("deprecated" in message for message in hf_log)
    hf_log.clear()
    hf_logging.warning_once.cache_clear()
    with warnings.catch_warnings():  # transformers 4.x warns at building a config with temperature and no do_sample
        warnings.simplefilter("ignore")
        config = GenerationConfig(max_new_tokens=4, temperature=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.manual_seed(0)
        merged = generate(Counting(), prompt, generation_config=config, top_k=3, do_sample=True)
        torch.manual_seed(0)
        expected = generate(Counting(), prompt, generation_config=GenerationConfig(
            max_new_tokens=4, temperature=0.5, top_k=3, do_sample=True))
    assert [message for message in hf_log if "deprecated" in message] == []
    assert torch.equal(merged, expected)
    torch.manual_seed(0)
    assert torch.equal(merged, generate(Counting(), prompt, max_new_tokens=4, temperature=0.5, top_k=3))


def test_a_generation_config_with_keyword_options_is_hfs_merge():
    hf = _model("gpt2")
    config = GenerationConfig(max_new_tokens=5, top_k=4, temperature=0.7, do_sample=True)
    theirs = _hf_generate(hf, PROMPT, seed=3, generation_config=config, top_k=7, repetition_penalty=1.3)
    torch.manual_seed(3)
    ours = generate(Recompute(recompute_callable(hf)), PROMPT, generation_config=config, top_k=7,
                    repetition_penalty=1.3)
    assert torch.equal(ours, theirs)
    assert config.top_k == 4  # never modified


# ------------------------------------------------------------------------------------------
# The loop's attention mask: one column longer a step, each one the model saw left as it was
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("new", [5, 300])  # past the first buffer of the growing mask too
def test_the_masks_the_model_saw_are_never_changed(new):
    seen = []

    def model(input_ids, attention_mask):
        seen.append((attention_mask, attention_mask.clone()))
        return TABLE[input_ids]

    prompts = torch.tensor([[0, 1, 2], [3, 4, 5]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    out = generate(Recompute(model), prompts, attention_mask=mask, max_new_tokens=new, pad_token_id=0)
    assert out.shape == (2, 3 + new)
    for step, (given, copy_then) in enumerate(seen):
        assert torch.equal(given, copy_then)
        assert given.tolist() == [[0] + [1] * (2 + step), [1] * (3 + step)]


def test_token_sequence_options_are_not_per_row_values():
    """A thinking tag or a breaker given as token ids is one sequence for every row, not a value per row."""
    table = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
    prompt = torch.tensor([[1, 2, 3]])

    def model(ids):
        return table[ids]

    ours = generate(model, prompt, max_new_tokens=4, thinking_budget=0, thinking_start=[3],
                             thinking_end=[7, 8])
    # the prompt ends inside a thinking span (its last token is the start tag): a budget of 0 forces the end tag
    assert ours[0, 3:5].tolist() == [7, 8]


def test_raw_logits_are_the_model_s_with_hfbridge_s_processors():
    """transformers keeps the tensor its processors receive as the step's raw logits: DRY must not write into it."""
    table = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
    prompt = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]])

    def model(ids):
        return table[ids]

    out = generate(model, prompt, max_new_tokens=3, dry_multiplier=5.0, dry_sequence_breakers=[],
                   return_dict_in_generate=True, output_logits=True, output_scores=True)
    for step, logits in enumerate(out.logits):
        assert torch.equal(logits, table[out.sequences[:, prompt.shape[1] + step - 1]])
    assert not torch.equal(out.scores[0], out.logits[0])  # DRY changed the scores, not the logits
