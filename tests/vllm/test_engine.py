"""hfbridge's processor inside a real vLLM engine (CPU, one engine for the module, a tiny random Llama saved
offline): greedy tokens equal transformers' and hfbridge's `generate`, sampled steps keep `Sampler`'s set,
requests without options are untouched, bad options are refused naming the option, a request that fails in
the worker ends alone."""

from __future__ import annotations

import gc
import math
import re

import pytest
import torch

pytest.importorskip("vllm.v1.sample.logits_processor", reason="vLLM is not installed (docs/vllm.md)")

from vllm import LLM, SamplingParams
from vllm.exceptions import VLLMValidationError

import hfbridge
from hfbridge import Sampler

import _tiny_llama
from _expected import COMMUNITY_GREEDY, HF_GREEDY, NEW, hf_tokens, raw_logits
from _tiny_llama import EOS, VOCAB

ENGINE = dict(dtype="float32", max_model_len=256, max_num_seqs=32, enforce_eager=True, seed=0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _tiny_llama.save(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def hf(folder):
    return _tiny_llama.model()


@pytest.fixture(scope="module")
def llm(folder):
    engine = LLM(model=str(folder), logits_processors=["hfbridge.vllm:HFBridgeLogitsProcessor"],
                 logprobs_mode="processed_logits", max_logprobs=-1, **ENGINE)
    yield engine
    _tiny_llama.shutdown(engine)
    del engine
    gc.collect()


def greedy(options=None, **fields):
    extra = None if options is None else {"hfbridge": options}
    return SamplingParams(temperature=0.0, max_tokens=NEW, extra_args=extra, **fields)


def run(llm, prompts, params):
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def test_a_batch_of_greedy_requests_equals_generate_per_request(llm, hf, folder):
    tokenizer = _tiny_llama.tokenizer()
    cases = [None] + HF_GREEDY + COMMUNITY_GREEDY
    prompts = _tiny_llama.prompts(len(cases), seed=2)
    got = run(llm, prompts, [greedy(options) for options in cases])  # one batch, every request its options
    for prompt, options, tokens in zip(prompts, cases, got):
        assert tokens == hf_tokens(hf, prompt, options or {}, tokenizer), options
    assert len({tuple(t) for t in got[1:]}) > 1


def test_one_option_set_batched_over_prompts_of_different_lengths(llm, hf):
    options = {"repetition_penalty": 1.4, "no_repeat_ngram_size": 2, "dry_multiplier": 0.5,
               "dry_sequence_breakers": [[3]]}
    prompts = _tiny_llama.prompts(16, seed=3, low=2, high=20)
    got = run(llm, prompts, greedy(options))  # one chain call per step for all 16
    for prompt, tokens in zip(prompts, got):
        expected = hfbridge.generate(hf, torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                                     eos_token_id=EOS, **options)[0, len(prompt):].tolist()
        assert tokens == expected


@pytest.mark.parametrize("options", [
    {"temperature": 0.8, "top_k": 6, "top_p": 0.9},
    {"top_n_sigma": 1.0, "repetition_penalty": 1.2, "top_k": 0},
    {"min_p": 0.05, "typical_p": 0.95, "no_repeat_ngram_size": 2},
])
def test_a_sampled_request_keeps_the_samplers_set_at_every_step(llm, hf, options):
    prompt = _tiny_llama.prompts(1, seed=4)[0]
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=11, logprobs=-1, extra_args={"hfbridge": options})
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
    generated = list(out.token_ids)
    raw = raw_logits(hf, prompt, generated)  # [T, V] the model's logits, from transformers
    sampler = Sampler(do_sample=True, **options)
    for step, token in enumerate(generated):
        ids = torch.tensor([prompt + generated[:step]])
        expected = sampler.process(ids, raw[step][None].clone())[0]  # [V]
        kept = {t for t in range(VOCAB) if expected[t] > -math.inf}
        scores = out.logprobs[step]  # processed logits vLLM drew from
        got = {t for t, logprob in scores.items() if logprob.logprob > -math.inf}
        assert got == kept, step
        assert token in kept
        for t in kept:
            assert scores[t].logprob == pytest.approx(float(expected[t]), abs=1e-3)


@pytest.mark.parametrize("options", [
    {"temperature": 0.8, "top_k": 6, "top_p": 0.9},
    {"min_p": 0.05, "typical_p": 0.95, "no_repeat_ngram_size": 2, "top_k": 0},
])
def test_processed_logprobs_reported_by_vllm_equal_the_replay(llm, hf, options):
    """vLLM's processed figures for a request through HFBridgeLogitsProcessor (all of the vocabulary's processed
    logits, `logprobs_mode="processed_logits"`, normalised as `processed_logprobs` does) against `hfbridge.replay`
    of the same tokens with transformers' model, teacher-forced: the same kept sets and log-probabilities within
    the two engines' float differences."""
    prompt = _tiny_llama.prompts(1, seed=7)[0]
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=13, logprobs=-1, extra_args={"hfbridge": options})
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
    generated = list(out.token_ids)
    processed = torch.tensor([[out.logprobs[step][t].logprob if t in out.logprobs[step] else -math.inf
                               for t in range(VOCAB)] for step in range(len(generated))])  # [S, V]
    reported = torch.log_softmax(processed, -1).gather(1, torch.tensor(generated)[:, None]).T  # [1, S]
    sequences = torch.tensor([prompt + generated])
    replayed = hfbridge.replay(hf, sequences, prompt_length=len(prompt), teacher_forced=True,
                               max_new_tokens=len(generated), do_sample=True, **options)
    # every token in the kept support; vLLM's figure within 1e-4 (measured on vLLM 0.32 CPU: 4.8e-7 and 1.5e-6)
    replayed.check(reported, atol=1e-4)
    for step in range(len(generated)):
        assert torch.equal(replayed.kept(step)[0], processed[step] > -math.inf), step


def test_mirostat_requests_keep_their_own_state(llm):
    options = {"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.2, "top_k": 0}
    prompts = _tiny_llama.prompts(3, seed=5)
    params = [SamplingParams(temperature=1.0, max_tokens=10, seed=20 + i, extra_args={"hfbridge": options})
              for i in range(3)]
    together = run(llm, prompts, params)
    alone = [run(llm, [p], [q])[0] for p, q in zip(prompts, params)]
    assert together == alone  # a request's draws and state do not depend on its batch


def test_requests_without_options_equal_an_engine_without_the_processor(llm, folder):
    prompts = _tiny_llama.prompts(6, seed=6)
    params = [SamplingParams(temperature=0.0, max_tokens=NEW),
              SamplingParams(temperature=0.9, top_p=0.8, max_tokens=NEW, seed=5),
              SamplingParams(temperature=1.0, top_k=5, repetition_penalty=1.3, max_tokens=NEW, seed=6),
              SamplingParams(temperature=0.0, max_tokens=NEW, extra_args={"other": 1}),
              SamplingParams(temperature=0.7, max_tokens=NEW, seed=8, extra_args={"hfbridge": {}}),
              greedy({"repetition_penalty": 1.5})]
    with_processor = run(llm, prompts, params)
    plain = LLM(model=str(folder), **ENGINE)
    try:
        without = run(plain, prompts[:5], params[:5])
    finally:
        _tiny_llama.shutdown(plain)
        del plain
        gc.collect()
    assert with_processor[:5] == without


@pytest.mark.parametrize(("options", "fields", "named"), [
    ({"top_kk": 3}, {}, "`top_kk`"),
    ({"repetition_penalty": -1.0}, {}, "repetition_penalty"),
    ({"no_repeat_ngram_size": "2"}, {}, "no_repeat_ngram_size"),
    ({"dry_base": 0.5}, {}, "`dry_base`"),
    ({"mirostat": 3}, {"temperature": 1.0}, "`mirostat`"),
    ({"top_p": 0.9}, {}, "`top_p` applies only when sampling"),
    ({"repetition_penalty": 1.2}, {"temperature": 0.7}, "SamplingParams.temperature"),
    ({"repetition_penalty": 1.2}, {"temperature": 1.0, "top_p": 0.9}, "SamplingParams.top_p"),
    ({"repetition_penalty": 1.2}, {"presence_penalty": 0.5}, "SamplingParams.presence_penalty"),
    ({"temperature": [0.5, 0.7]}, {"temperature": 1.0}, "one value per request"),
    ({"do_sample": True}, {}, "`do_sample`"),
    ({"max_new_tokens": 5}, {}, "SamplingParams.max_tokens"),
])
def test_bad_options_are_refused_before_the_request_runs(llm, options, fields, named):
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 4, **fields}, extra_args={"hfbridge": options})
    with pytest.raises(VLLMValidationError, match=re.escape(named)):
        llm.generate([{"prompt_token_ids": [5, 6]}], params, use_tqdm=False)


def test_a_request_failing_in_the_worker_ends_alone(llm, hf):
    prompts = _tiny_llama.prompts(2, seed=7)
    got = run(llm, prompts, [greedy({"suppress_tokens": [VOCAB + 4]}), greedy({"repetition_penalty": 1.5})])
    assert got[0] == [EOS]  # ended at once; the worker logs why
    assert got[1] == hf_tokens(hf, prompts[1], {"repetition_penalty": 1.5})
    assert run(llm, prompts[1:], [greedy({"repetition_penalty": 1.5})]) == got[1:]  # the engine still serves
