"""Tensor parallel: two CPU workers (one core each, bound by hand) each build their own processor and give
the tokens one worker gives (transformers' and hfbridge's `generate`), the seeded XTC coin included."""

from __future__ import annotations

import gc

import pytest

pytest.importorskip("vllm.v1.sample.logits_processor", reason="vLLM is not installed (docs/vllm.md)")

from vllm import LLM, SamplingParams

from hfbridge.vllm import HFBridgeLogitsProcessor

import _tiny_llama
from _expected import COMMUNITY_GREEDY, HF_GREEDY, NEW, hf_tokens

ENGINE = dict(dtype="float32", max_model_len=256, max_num_seqs=32, enforce_eager=True, seed=0,
              logits_processors=[HFBridgeLogitsProcessor])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _tiny_llama.save(tmp_path_factory.mktemp("tiny-llama"))


def generate(folder, prompts, params, **engine):
    llm = LLM(model=str(folder), **ENGINE, **engine)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        _tiny_llama.shutdown(llm)
        del llm
        gc.collect()
    return [list(out.outputs[0].token_ids) for out in outputs]


def test_two_workers_give_one_workers_tokens(folder, monkeypatch):
    cases = [None] + HF_GREEDY + COMMUNITY_GREEDY
    prompts = _tiny_llama.prompts(len(cases) + 3, seed=2)
    params = [SamplingParams(temperature=0.0, max_tokens=NEW, extra_args=None if o is None else {"hfbridge": o})
              for o in cases]
    xtc = {"xtc_probability": 0.5, "xtc_threshold": 0.05, "top_k": 0}  # a coin per row and step, in each worker
    sampled = [SamplingParams(temperature=1.0, max_tokens=NEW, seed=3 + i, extra_args={"hfbridge": xtc})
               for i in range(2)] + [SamplingParams(temperature=1.0, max_tokens=NEW, extra_args={"hfbridge": xtc})]
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # one core per worker
    got = generate(folder, prompts, params + sampled, tensor_parallel_size=2, distributed_executor_backend="mp")
    hf = _tiny_llama.model()
    tokenizer = _tiny_llama.tokenizer()
    for prompt, options, tokens in zip(prompts, cases, got):
        assert tokens == hf_tokens(hf, prompt, options or {}, tokenizer), options
    # workers that drew different coins would hold different histories and caches: their partial sums
    # would no longer add up to one worker's, and the sampled tokens would part from one worker's
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    one = generate(folder, prompts, params + sampled)  # the same batch on one worker
    assert got[:-1] == one[:-1]  # (vLLM's own unseeded draw, the last request's, differs between the two set-ups)
