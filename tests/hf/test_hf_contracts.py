"""The contracts with transformers' private code (`hfbridge._hf`), broken on purpose.

transformers 5.24 renamed the cache from `past_key_values` to `cache` in its loops, and hfbridge,
still handing it over under the old name, got beams continued from the wrong cache rows with no
error. Here the same kind of rename is simulated on the installed version by making hfbridge use
the *other* name (monkeypatched), and every such break must end in `TransformersContractError`
naming the version and the contract, never in tokens.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from transformers.generation.utils import GenerationMixin

from hfbridge import ReturnsCache, compute_transition_scores, generate
from hfbridge._generate.hf_loops import assisted_stand_ins
from hfbridge._generate.hf_loops.assisted_stand_ins import DraftHost
from hfbridge._hf import contracts, names
from hfbridge._hf.contracts import TransformersContractError

V = 16
TABLE = torch.randn(V, V, generator=torch.Generator().manual_seed(0))
PROMPT = torch.tensor([[1, 2, 3, 1, 2]])
OTHER_NAME = "past_key_values" if names.LOOP_CACHE == "cache" else "cache"


def _cached_model():
    """A bigram model with a real per-row cache (the tokens seen, (batch, seq, 1)): reorder and crop matter."""
    def model(input_ids, cache):
        seen = input_ids[..., None].float() if cache is None else torch.cat([cache, input_ids[..., None].float()], 1)
        mix = seen.mean(dim=1).long().clamp(0, V - 1)  # [B, 1]: depends on every cached token of the row
        return TABLE[input_ids] + 0.3 * TABLE[mix], seen  # [B, T, V]
    return ReturnsCache(model)


def _rename(monkeypatch, *, loop=True, output=False):
    if loop:
        monkeypatch.setattr(names, "LOOP_CACHE", OTHER_NAME)
    if output:
        monkeypatch.setattr(names, "OUTPUT_CACHE", OTHER_NAME)


def _expect(contract):
    return pytest.raises(TransformersContractError,
                         match=rf"transformers {names.TRANSFORMERS_VERSION_TEXT} broke a contract .*\({contract}:")


@pytest.mark.parametrize("do_sample", [False, True], ids=["beam_search", "beam_sampling"])
def test_beam_loop_that_reads_the_cache_under_another_name_is_an_error_not_wrong_beams(monkeypatch, do_sample):
    torch.manual_seed(0)
    generate(_cached_model(), PROMPT, num_beams=3, max_new_tokens=4, do_sample=do_sample)  # fine as installed
    _rename(monkeypatch)
    with _expect("beam-reorder"):
        generate(_cached_model(), PROMPT, num_beams=3, max_new_tokens=4, do_sample=do_sample)


def test_the_error_names_the_contract_and_the_cache_name(monkeypatch):
    _rename(monkeypatch)
    with pytest.raises(TransformersContractError) as caught:
        generate(_cached_model(), PROMPT, num_beams=2, max_new_tokens=3)
    assert caught.value.contract == "beam-reorder"
    message = str(caught.value)
    assert f"model_kwargs['{OTHER_NAME}']" in message and "0 time(s)" in message and "docs/versions.md" in message


def test_a_beam_loop_that_stops_reordering_is_an_error(monkeypatch):
    monkeypatch.setattr("hfbridge._generate.hf_loops.loop_stand_in.AdapterCache.reorder_cache", lambda self, beam_idx: None)
    with _expect("beam-reorder"):
        generate(_cached_model(), PROMPT, num_beams=2, max_new_tokens=3)


def test_one_new_token_needs_no_reorder(monkeypatch):
    _rename(monkeypatch)  # the loop never calls the model a second time: nothing could go wrong
    out = generate(_cached_model(), PROMPT, num_beams=2, max_new_tokens=1)
    assert out.shape == (1, 6)


@pytest.mark.parametrize("strategy", ["assistant", "prompt_lookup"])
def test_assisted_loop_that_reads_the_cache_under_another_name_is_an_error(monkeypatch, strategy):
    options = {"assistant_model": _cached_model()} if strategy == "assistant" else {"prompt_lookup_num_tokens": 2}
    generate(_cached_model(), PROMPT, max_new_tokens=6, **options)  # fine as installed
    _rename(monkeypatch, loop=True, output=True)
    with pytest.raises(TransformersContractError, match=names.TRANSFORMERS_VERSION_TEXT):
        generate(_cached_model(), PROMPT, max_new_tokens=6, **options)


def test_an_assisted_loop_that_stops_cropping_is_an_error(monkeypatch):
    monkeypatch.setattr(assisted_stand_ins.Rollback, "crop", lambda self, amount: None)
    with _expect("assisted-crop"):
        generate(_cached_model(), PROMPT, prompt_lookup_num_tokens=2, max_new_tokens=6)


def test_output_classes_without_the_cache_field_are_an_error(monkeypatch):
    contracts._check_fields.cache_clear()
    _rename(monkeypatch, loop=False, output=True)
    try:
        with _expect("output-fields"):
            generate(_cached_model(), PROMPT, max_new_tokens=2, return_dict_in_generate=True)
        with _expect("output-fields"):
            generate(_cached_model(), PROMPT, num_beams=2, max_new_tokens=2, return_dict_in_generate=True)
    finally:
        contracts._check_fields.cache_clear()


def test_a_draft_cache_not_handed_back_is_an_error():
    from transformers import GenerationConfig

    draft = DraftHost(_cached_model(), device=torch.device("cpu"), generation_config=GenerationConfig(),
                      layout=None, vocab_size=None)
    config = GenerationConfig(do_sample=False)
    draft.generate(PROMPT, generation_config=config, max_new_tokens=2)  # the first draft starts fresh
    with _expect("draft-cache"):
        draft.generate(PROMPT, generation_config=config, max_new_tokens=2)  # HF forgot to hand its cache back
    first = draft.generate  # a cache under a name hfbridge does not expect
    with _expect("draft-cache"):
        first(PROMPT, generation_config=config, max_new_tokens=2, **{OTHER_NAME: assisted_stand_ins.Rollback(draft)})


def test_a_loop_signature_without_an_argument_is_an_error(monkeypatch):
    def beam_search(self, input_ids, logits_processors, stopping_criteria, generation_config, synced_gpus=False,
                    **model_kwargs):  # a release that renamed logits_processor
        raise AssertionError("must not run")
    monkeypatch.setattr(GenerationMixin, "_beam_search", beam_search)
    with _expect("loop-signature"):
        generate(_cached_model(), PROMPT, num_beams=2, max_new_tokens=2)


def test_crop_convention_by_version():
    if names.CROP_TAKES_REMOVED:
        assert [names.crop_keeps(7, amount) for amount in (0, -2, -9)] == [7, 5, 0]
    else:
        assert [names.crop_keeps(7, amount) for amount in (5, 7, -2)] == [5, 7, 5]


STRATEGIES = {
    "greedy": dict(do_sample=False),
    "sampling": dict(do_sample=True, top_k=5),
    "beam_search": dict(num_beams=3, num_return_sequences=2),
    "beam_sampling": dict(num_beams=3, do_sample=True),
    "assisted": dict(assistant_model="draft"),
    "prompt_lookup": dict(prompt_lookup_num_tokens=2),
}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_hfbridge_triggers_no_transformers_deprecation_warning(monkeypatch, strategy):
    """Warnings as errors (transformers' FutureWarning / DeprecationWarning) and its logger's deprecation
    messages recorded, for every strategy with return_dict_in_generate=True; the model is not HF's."""
    logged = []

    def warning_once(self, message, *args, **kwargs):
        if "deprecat" in str(message).lower():
            logged.append(str(message))

    def warning(self, message, *args, **kwargs):
        if self.name.startswith("transformers") and "deprecat" in str(message).lower():
            logged.append(str(message))

    monkeypatch.setattr(logging.Logger, "warning_once", warning_once, raising=False)
    monkeypatch.setattr(logging.Logger, "warning", warning)
    options = dict(STRATEGIES[strategy])
    if options.get("assistant_model") == "draft":
        options["assistant_model"] = _cached_model()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        out = generate(_cached_model(), PROMPT, max_new_tokens=4, return_dict_in_generate=True, output_scores=True,
                       output_logits=True, **options)
        compute_transition_scores(out.sequences, out.scores, getattr(out, "beam_indices", None))
    assert logged == []
    assert out.sequences.shape[1] == PROMPT.shape[1] + 4 or strategy.startswith("beam")


def test_a_loop_and_cache_that_disagree_on_crop_give_an_error_or_the_same_tokens(monkeypatch):
    """Simulates the change of `crop`'s meaning (a length to keep up to 5.10, minus the positions to remove
    since 5.17): read the wrong way round, a length is an error; minus a count is still read right."""
    expected = generate(_cached_model(), PROMPT, prompt_lookup_num_tokens=2, max_new_tokens=6)
    monkeypatch.setattr(names, "CROP_TAKES_REMOVED", not names.CROP_TAKES_REMOVED)
    failed = None
    try:
        got = generate(_cached_model(), PROMPT, prompt_lookup_num_tokens=2, max_new_tokens=6)
    except TransformersContractError as error:  # a loop that passes lengths (4.x to 5.13), read as removals
        failed = error
    if failed is not None:
        assert names.CROP_TAKES_REMOVED and failed.contract == "assisted-crop"
    else:  # 5.14+ pass minus the number to remove, which both readings understand
        assert torch.equal(got, expected)


def test_a_beam_loop_whose_first_call_is_not_the_prompt_is_an_error(monkeypatch):
    from hfbridge._generate.hf_loops.loop_stand_in import LoopHost

    original = LoopHost.__call__

    def first_call_shortened(self, input_ids, attention_mask=None, **kwargs):
        if self.early is not None:  # HF's first call, as a release that fed the prompt in pieces would make it
            input_ids, attention_mask = input_ids[:, 1:], attention_mask[:, 1:]
        return original(self, input_ids, attention_mask, **kwargs)

    monkeypatch.setattr(LoopHost, "__call__", first_call_shortened)
    with _expect("beam-first-call"):
        generate(_cached_model(), PROMPT, num_beams=2, max_new_tokens=3)
