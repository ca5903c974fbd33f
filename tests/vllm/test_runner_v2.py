"""Model Runner V2's processor, driven as vLLM's runner and sampler call it (`_runner_v2.py`), on a tiny Llama:
tokens equal `hfbridge.generate` with the same options for every request, through recycled slots, rows
reordered every step, preemption, chunked prefill and a tensor-parallel rank pair. Each test runs with
`HFBridgeLogitsProcessorV2` on vLLM's own V2 interface where vLLM is installed (CI's vllm job), and with the
`Slots` it wraps elsewhere. Model Runner V2 itself needs Triton, which vLLM's CPU build lacks."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _runner_v2 import Request, Runner

import hfbridge
from hfbridge.vllm._slots import Slots

import _tiny_llama
from _expected import COMMUNITY_GREEDY, HF_GREEDY, NEW
from _tiny_llama import EOS, VOCAB

try:
    import vllm.v1.worker.gpu.sample.logits_processor  # noqa: F401
    HAS_VLLM = True
except ImportError:  # pragma: no cover - depends on what is installed
    HAS_VLLM = False

SAMPLED = [
    {"temperature": 0.8, "top_k": 5},
    {"top_p": 0.9, "top_k": 0, "repetition_penalty": 1.3},
    {"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2, "top_k": 0},
    {"min_p": 0.05, "dry_multiplier": 0.8, "dry_sequence_breakers": [[3]], "top_k": 0},
    {"top_n_sigma": 1.0, "top_k": 0},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _tiny_llama.save(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def model():
    return _tiny_llama.model()


def config(folder, *, speculative=None):
    model_config = SimpleNamespace(seed=0, hf_config=SimpleNamespace(eos_token_id=EOS), tokenizer=str(folder),
                                   tokenizer_revision=None, trust_remote_code=False, get_vocab_size=lambda: VOCAB)
    return SimpleNamespace(model_config=model_config, speculative_config=speculative,
                           scheduler_config=SimpleNamespace(max_num_seqs=4))


@pytest.fixture(params=["HFBridgeLogitsProcessorV2", "Slots"])
def engine(request, folder):
    """`(make, params)`: a rank's processor from its request state, and `SamplingParams` (or its fields)."""
    if request.param == "Slots":
        if HAS_VLLM:
            pytest.skip("vLLM is installed: the class that wraps `Slots` runs these (the same calls)")
        from hfbridge.vllm._requests import engine_settings

        def params(options=None, temperature=0.0, seed=None):
            return SimpleNamespace(extra_args=None if options is None else {"hfbridge": options}, seed=seed,
                                   temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                                   presence_penalty=0.0, frequency_penalty=0.0, all_stop_token_ids=set())

        return (lambda state: Slots(state, **engine_settings(config(folder)))), params
    if not HAS_VLLM:
        pytest.skip("vLLM is not installed (docs/vllm.md)")
    from vllm import SamplingParams

    from hfbridge.vllm import HFBridgeLogitsProcessorV2

    def params(options=None, temperature=0.0, seed=None):
        return SamplingParams(temperature=temperature, max_tokens=NEW, seed=seed,
                              extra_args=None if options is None else {"hfbridge": options})

    return (lambda state: HFBridgeLogitsProcessorV2(config(folder), state)), params


def request(name, prompt, options, params, *, seed=None, own_seed=None, **fields):
    """A request: greedy, or sampled by the driver with a generator seeded `seed` (`own_seed`: `SamplingParams.seed`)."""
    sampled = seed is not None
    return Request(name, list(prompt), params(options, 1.0 if sampled else 0.0, own_seed), NEW, (EOS,),
                   generator=torch.Generator().manual_seed(seed) if sampled else None, **fields)


def expected(model, prompt, options, *, seed=None):
    """`hfbridge.generate`'s tokens after `prompt` with these options (a sampled request: its generator's draws)."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    out = hfbridge.generate(model, torch.tensor([prompt]), max_new_tokens=NEW, do_sample=seed is not None,
                            eos_token_id=EOS, tokenizer=_tiny_llama.tokenizer(), generator=generator,
                            **(options or {}))
    return out[0, len(prompt):].tolist()


def test_requests_through_recycled_slots_give_generates_tokens(engine, model):
    make, params = engine
    greedy = HF_GREEDY + COMMUNITY_GREEDY + [None, {}]  # the last ones land in slots that held options
    prompts = _tiny_llama.prompts(len(greedy) + len(SAMPLED), seed=2)
    requests = [request(f"g{i}", prompts[i], options, params) for i, options in enumerate(greedy)]
    requests += [request(f"s{i}", prompts[len(greedy) + i], options, params, seed=100 + i)
                 for i, options in enumerate(SAMPLED)]
    runner = Runner(make, model, vocab_size=VOCAB, slots=4)
    runner.run(requests)
    for item, options in zip(requests, greedy + SAMPLED):
        seed = 100 + SAMPLED.index(options) if item.name.startswith("s") else None
        assert item.output == expected(model, item.prompt, options, seed=seed), (item.name, options)
    assert len({tuple(step["slots"]) for step in runner.log}) > 10  # slots recycled, rows reordered
    assert runner.needs.dtype == bool


def test_requests_without_options_are_not_taken_and_stay_bit_equal(engine, model):
    make, params = engine
    runner = Runner(make, model, vocab_size=VOCAB, slots=2)
    runner.run([request("plain", [5, 6, 7], None, params), request("empty", [8, 9], {}, params)])
    assert not runner.needs.any()  # the sampler then skips every processor
    processor = runner.processors[0]
    logits = torch.randn(2, VOCAB)
    ctx = SimpleNamespace(idx_mapping_np=np.array([0, 1]), seq_lens_upper_bound_np=np.array([3, 2]))
    assert processor.apply(logits, ctx) is logits and torch.equal(logits, logits.clone())


def test_a_preempted_request_resumes_counting_from_its_prompt(engine, model):
    make, params = engine
    counting = [{"presence_penalty": 20.0}, {"frequency_penalty": 8.0, "min_new_tokens": 10},
                {"exponential_decay_length_penalty": [2, 1.6]}, {"repetition_penalty": 1.4, "min_length": 16}]
    prompts = _tiny_llama.prompts(len(counting), seed=8)
    requests = [request(f"r{i}", prompts[i], options, params) for i, options in enumerate(counting)]
    runner = Runner(make, model, vocab_size=VOCAB, slots=3)
    runner.run(requests, preempt={"r0": 4, "r1": 3, "r2": 2, "r3": 5})
    resumed = {name: (prompt, prefill) for name, _, prompt, prefill in runner.added if prefill != prompt}
    assert sorted(resumed) == ["r0", "r1", "r2", "r3"]
    for item, options in zip(requests, counting):
        assert item.output == expected(model, item.prompt, options), item.name
    # the prompt length matters: counting from the resumed prefill instead gives other tokens
    wrong = expected(model, prompts[0] + requests[0].output[:4], counting[0])
    assert requests[0].output[4:] != wrong[: len(requests[0].output) - 4]


def test_a_prompt_prefilled_in_chunks_is_processed_at_its_last_chunk_only(engine, model):
    make, params = engine
    prompts = _tiny_llama.prompts(2, seed=9, low=10, high=12)
    mirostat = SAMPLED[2]
    requests = [request("m", prompts[0], mirostat, params, seed=7, chunk=4),
                request("g", prompts[1], {"no_repeat_ngram_size": 2}, params, chunk=3)]
    runner = Runner(make, model, vocab_size=VOCAB, slots=2)
    runner.run(requests)
    assert requests[0].output == expected(model, prompts[0], mirostat, seed=7)  # mirostat's state moved once a step
    assert requests[1].output == expected(model, prompts[1], {"no_repeat_ngram_size": 2})
    first = runner.log[0]
    assert max(first["seq_lens"]) < 10 and torch.equal(first["processed"], first["raw"])  # chunks: untouched


def test_two_tensor_parallel_ranks_give_the_same_scores_xtc_included(engine, model):
    make, params = engine
    xtc = {"xtc_probability": 0.5, "xtc_threshold": 0.05, "top_k": 0}
    prompts = _tiny_llama.prompts(5, seed=10)
    requests = [request("shared coin", prompts[0], xtc, params, seed=30),  # XTC's generator from the engine's seed
                request("own coin", prompts[1], xtc, params, seed=31, own_seed=5),  # from the request's seed
                request("greedy", prompts[2], {"repetition_penalty": 1.5}, params),
                request("plain", prompts[3], None, params),
                request("sampled", prompts[4], {"top_k": 4}, params, seed=34)]
    runner = Runner(make, model, vocab_size=VOCAB, slots=4, ranks=2)
    runner.run(requests)  # asserts at every step that both ranks' scores are equal
    assert requests[2].output == expected(model, prompts[2], {"repetition_penalty": 1.5})
    assert requests[3].output == expected(model, prompts[3], None)
    assert requests[4].output == expected(model, prompts[4], {"top_k": 4}, seed=34)
    coins = [step["processed"] for step in runner.log]
    assert any((step.isinf() & ~raw.isinf()).any() for step, raw in zip(coins, (s["raw"] for s in runner.log)))


def test_speculative_decoding_ends_requests_with_options_and_leaves_the_others(folder, caplog):
    from hfbridge.vllm._requests import engine_settings
    from hfbridge.vllm._slots import SPECULATIVE

    state = Runner(lambda s: None, None, vocab_size=VOCAB, slots=4).states[0]
    slots = Slots(state, refuse=SPECULATIVE, **engine_settings(config(folder)))
    params = SimpleNamespace(extra_args={"hfbridge": {"repetition_penalty": 1.3}}, temperature=0.0, seed=None,
                             all_stop_token_ids={EOS, 5})
    with caplog.at_level(logging.ERROR):
        assert slots.add_request(3, params)
    assert "speculative decoding" in caplog.text
    assert not slots.add_request(1, SimpleNamespace(extra_args=None))
    logits = torch.randn(5, VOCAB)  # slot 1: rows 0-1; slot 3: rows 2-4 (two draft tokens and the bonus)
    ctx = SimpleNamespace(idx_mapping_np=np.array([1, 3]), expanded_idx_mapping=torch.tensor([1, 1, 3, 3, 3]))
    result = slots.apply(logits.clone(), ctx)
    assert torch.equal(result[:2], logits[:2])
    for row in range(2, 5):
        assert result[row].isfinite().nonzero().flatten().tolist() == [EOS, 5]
        assert torch.equal(result[row, [EOS, 5]], logits[row, [EOS, 5]])


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (docs/vllm.md)")
def test_naming_the_other_runners_class_names_the_right_one(folder):
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.sample.logits_processor import build_logitsprocs
    from vllm.v1.worker.gpu.sample.logits_processor import (
        build_custom_logits_processors,
        build_custom_logits_processors_params_validator,
    )

    from hfbridge.vllm import HFBridgeLogitsProcessor, HFBridgeLogitsProcessorV2

    state = Runner(lambda s: None, None, vocab_size=VOCAB, slots=4).states[0]
    v2 = build_custom_logits_processors(config(folder), state, False, ["hfbridge.vllm:HFBridgeLogitsProcessorV2"])
    assert [type(p) for p in v2] == [HFBridgeLogitsProcessorV2]
    for named in ("hfbridge.vllm:HFBridgeLogitsProcessor", HFBridgeLogitsProcessor):  # Model Runner V2
        with pytest.raises(TypeError, match=re.escape("Name `hfbridge.vllm:HFBridgeLogitsProcessorV2` instead")):
            build_custom_logits_processors(config(folder), state, False, [named])
    for named in ("hfbridge.vllm:HFBridgeLogitsProcessorV2", HFBridgeLogitsProcessorV2):  # the V1 runner
        with pytest.raises(TypeError, match=re.escape("Name `hfbridge.vllm:HFBridgeLogitsProcessor` instead")):
            build_logitsprocs(config(folder), torch.device("cpu"), False, False, [named])
    from vllm import SamplingParams

    validate = build_custom_logits_processors_params_validator(["hfbridge.vllm:HFBridgeLogitsProcessorV2"])
    validate(SamplingParams(temperature=0.0, extra_args={"hfbridge": {"repetition_penalty": 1.2}}))
    with pytest.raises(VLLMValidationError, match=re.escape("`top_kk` is not an hfbridge option")):
        validate(SamplingParams(temperature=0.0, extra_args={"hfbridge": {"top_kk": 3}}))
    with pytest.raises(VLLMValidationError, match=re.escape("`temperature` takes one value per request")):
        validate(SamplingParams(temperature=1.0, extra_args={"hfbridge": {"temperature": [0.5, 0.7]}}))


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (docs/vllm.md)")
def test_a_vllm_without_model_runner_v2s_interface_names_the_v1_class(monkeypatch):
    import sys

    import hfbridge.vllm

    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu.sample.logits_processor", None)  # as if absent
    monkeypatch.delitem(sys.modules, "hfbridge.vllm.processor_v2", raising=False)
    with pytest.raises(ImportError, match=re.escape("its engines run the V1 runner, which takes "
                                                    "`hfbridge.vllm.HFBridgeLogitsProcessor`")):
        hfbridge.vllm.HFBridgeLogitsProcessorV2


@pytest.mark.parametrize("options", [
    {"mirostat": 1, "mirostat_tau": 3.0, "mirostat_eta": 0.5, "mirostat_m": 20, "top_k": 0},
    {"adaptive_target": 0.3, "adaptive_decay": 0.5, "top_k": 0},
    {"thinking_budget": 2, "thinking_start": [5], "thinking_end": [8, 9], "thinking_budget_message": [7],
     "top_k": 0},
], ids=["mirostat1", "adaptive_p", "thinking_budget"])
def test_concurrent_requests_with_equal_stateful_options_keep_their_own_state(engine, model, options):
    """Two requests with the same options at once: each keeps its own state (mirostat's mu, adaptive-p's
    average, the budget's count), as `hfbridge.generate` gives each alone."""
    make, params = engine
    prompts = [[11, 40, 5], [23, 5]]  # each opens a thinking span (the budget's start tag, 5)
    requests = [request(f"r{i}", prompt, options, params, seed=50 + i) for i, prompt in enumerate(prompts)]
    runner = Runner(make, model, vocab_size=VOCAB, slots=2)
    runner.run(requests)
    assert all(len(step["slots"]) == 2 for step in runner.log[:3])  # both requests ran in the same steps
    for i, item in enumerate(requests):
        assert item.output == expected(model, item.prompt, options, seed=50 + i), (item.name, options)


@pytest.mark.parametrize("options", [{"mirostat": 1, "mirostat_tau": 3.0, "mirostat_eta": 0.5, "mirostat_m": 20},
                                     {"adaptive_target": 0.3, "adaptive_decay": 0.5}], ids=["mirostat1", "adaptive_p"])
def test_a_request_that_continues_an_earlier_ones_text_starts_a_fresh_state(engine, model, options):
    """A chat's next turn: its prompt is the previous request's prompt and answer, with the same options. Its state
    starts fresh at its own prompt's end, as `hfbridge.generate` on that prompt gives."""
    make, params = engine
    options = {**options, "top_k": 0}
    runner = Runner(make, model, vocab_size=VOCAB, slots=1)
    first = request("turn1", [11, 40, 5], options, params, seed=60)
    runner.run([first])
    assert len(first.output) > 3
    second = request("turn2", first.prompt + first.output, options, params, seed=61)
    runner.run([second])
    assert second.output == expected(model, second.prompt, options, seed=61)
