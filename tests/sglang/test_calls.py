"""hfbridge's SGLang processor without SGLang: requests driven as SGLang's scheduler drives a custom logit
processor (`_driver.py`) give `hfbridge.generate`'s tokens; options are checked with the option's name."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from _cases import EOS, GREEDY, PROMPTS, SAMPLING, V, expected
from _driver import Req, run

from hfbridge.sglang._calls import Requests
from hfbridge.sglang._custom_params import check_params


def processor_per_call(store):
    """A fresh "instance" per call that shares `store`, as the SGLang class shares its own."""
    return lambda: (lambda logits, params: store.process(logits, params))


@pytest.mark.parametrize("do_sample", [False, True])
def test_tokens_equal_hfbridge_generate(model, do_sample):
    options = SAMPLING if do_sample else GREEDY
    # two requests per option set, with prompts of other lengths: equal options share a call, padded
    cases = [(prompt, options[i % len(options)]) for i, prompt in enumerate(PROMPTS + PROMPTS[::-1])]
    requests = [Req(f"r{i}", prompt, opts, greedy=not do_sample, eos=[EOS]) for i, (prompt, opts) in enumerate(cases)]
    generators = [torch.Generator().manual_seed(100 + i) for i in range(len(cases))]
    outputs = run(model, requests, processor_per_call(Requests()), steps=8, generators=generators)
    for i, ((prompt, opts), output) in enumerate(zip(cases, outputs, strict=True)):
        assert output == expected(model, prompt, opts, do_sample=do_sample, steps=8, seed=100 + i), (i, opts)


def test_equal_options_share_one_call(model, monkeypatch):
    from hfbridge._step.run.sampler import Sampler

    calls = []
    original = Sampler.process
    monkeypatch.setattr(Sampler, "process", lambda self, ids, scores: calls.append(ids.shape) or original(
        self, ids, scores))
    requests = [Req(f"s{i}", prompt, {"repetition_penalty": 1.3}) for i, prompt in enumerate(PROMPTS)]
    run(model, requests, processor_per_call(Requests()), steps=2)
    assert calls == [(4, 8), (4, 9)]  # one call per step for the four requests, padded to the longest


def test_a_chain_that_never_reads_the_ids_gets_none(model, monkeypatch):
    """Top-n-sigma and HF's warpers never read the ids (`reads_ids`): no histories are built for them, and the
    tokens stay `hfbridge.generate`'s."""
    from hfbridge._step.run.sampler import Sampler

    calls = []
    original = Sampler.process
    monkeypatch.setattr(Sampler, "process", lambda self, ids, scores: calls.append((ids.shape, scores.shape[1]))
                        or original(self, ids, scores))
    opts = {"top_n_sigma": 2.0, "min_p": 0.05, "top_k": 0, "temperature": 0.9}
    requests = [Req(f"x{i}", prompt, opts, greedy=False, eos=[EOS]) for i, prompt in enumerate(PROMPTS)]
    generators = [torch.Generator().manual_seed(100 + i) for i in range(len(PROMPTS))]
    outputs = run(model, requests, processor_per_call(Requests()), steps=3, generators=generators)
    assert calls and all(shape[1] == 0 and width == V for shape, width in calls)  # no ids, no padding column
    assert sum(shape[0] for shape, _ in calls) == 3 * len(PROMPTS)
    for i, (prompt, output) in enumerate(zip(PROMPTS, outputs, strict=True)):
        assert output == expected(model, prompt, opts, do_sample=True, steps=3, seed=100 + i), i


@pytest.mark.parametrize("opts", [{"mirostat": 2, "mirostat_tau": 2.0, "mirostat_eta": 0.5}, {"mirostat": 1},
                                  {"adaptive_target": 0.3, "adaptive_decay": 0.5},
                                  {"thinking_budget": 2, "thinking_start": [5], "thinking_end": [8]}])
def test_stateful_state_follows_the_request_across_fresh_instances(model, opts):
    """The state lives in the store, keyed by request id: a fresh processor each step loses nothing, and rows
    reordered every step keep their own state (checked by the tokens, against hfbridge.generate). Mirostat and
    adaptive-p requests of equal options share one chain (`follow`); a thinking budget keeps one per request."""
    assert check_params(opts, _params(top_k=1 << 30)).stateful
    requests = [Req(f"m{i}", prompt, opts, greedy=False) for i, prompt in enumerate(PROMPTS)]
    generators = [torch.Generator().manual_seed(7 + i) for i in range(len(PROMPTS))]
    store = Requests()
    outputs = run(model, requests, processor_per_call(store), steps=10, generators=generators)
    for i, prompt in enumerate(PROMPTS):
        assert outputs[i] == expected(model, prompt, opts, do_sample=True, steps=10, seed=7 + i)
    own = "thinking_budget" in opts
    assert (len(store._shared), len(store._followed)) == ((0, 0) if own else (1, 1))
    assert all((entry.own is not None) is own for entry in store._requests.values())


def test_a_shared_state_chain_that_fails_fails_every_request_of_it(model, monkeypatch):
    """A chain with a state shared by several requests: if its call raises, each of them fails (their states
    are no longer known), and a request of other options in the same call keeps its scores."""
    from hfbridge import Sampler

    failed = []
    store = Requests(fail=lambda req, message: failed.append((req.rid, message)))
    mirostat = [Req(f"s{i}", PROMPTS[i], {"mirostat": 2}, greedy=False) for i in range(2)]
    other = Req("o", PROMPTS[2], {"repetition_penalty": 1.2})
    params = [request.custom_params for request in [*mirostat, other]]
    store.process(torch.randn(3, V), params)
    process = Sampler.process

    def failing(self, input_ids, scores):
        if any(type(p).__name__ == "MirostatLogitsWarper" for p in self.processors):
            raise ValueError("mirostat broke")
        return process(self, input_ids, scores)

    monkeypatch.setattr(Sampler, "process", failing)
    for request in mirostat:
        request.output_ids.append(4)
    logits = torch.ones(3, V)
    result = store.process(logits.clone(), params)
    assert [rid for rid, _ in failed] == ["s0", "s1"]
    assert all("mirostat broke" in message and "shared by 2 requests" in message for _, message in failed)
    assert torch.equal(result[:2], logits[:2])  # failed rows are left as they are (the processor ends them)
    assert result[2, PROMPTS[2][0]] == 1 / 1.2


def test_a_bad_request_fails_alone_with_the_options_name(model):
    failed = []
    store = Requests(fail=lambda req, message: failed.append((req.rid, message)) or setattr(
        req, "to_finish", "abort"))
    requests = [Req("good", PROMPTS[0], {"repetition_penalty": 1.3}), Req("bad", PROMPTS[1], {"dry_multiplierr": 1}),
                Req("vocab", PROMPTS[2], {"suppress_tokens": [V + 5]})]
    outputs = run(model, requests, processor_per_call(store), steps=3)
    assert [rid for rid, _ in failed] == ["bad", "vocab"] or [rid for rid, _ in failed] == ["vocab", "bad"]
    messages = dict(failed)
    assert "`dry_multiplierr` is not an hfbridge option SGLang requests take. Did you mean `dry_multiplier`?" in (
        messages["bad"])
    assert str(V + 5) in messages["vocab"]
    assert outputs[1] == [] and outputs[2] == []  # ended at their first step
    assert outputs[0] == expected(model, PROMPTS[0], {"repetition_penalty": 1.3}, do_sample=False, steps=3)


def test_without_a_fail_callback_the_error_is_raised(model):
    with pytest.raises(ValueError, match="`top_n_sigma` applies only when sampling"):
        run(model, [Req("g", [1, 2], {"top_n_sigma": 1.0})], processor_per_call(Requests()), steps=1)
    req = Req("x", [1, 2], {"repetition_penalty": 1.2})
    with pytest.raises(ValueError, match="speculative decoding"):
        Requests().process(torch.zeros(2, V), [req.custom_params, req.custom_params])
    with pytest.raises(ValueError, match="without `__req__`"):
        Requests().process(torch.zeros(1, V), [{"repetition_penalty": 1.2}])


def test_finished_requests_are_forgotten(model):
    store = Requests()
    requests = [Req(f"f{i}", PROMPTS[i], {"mirostat": 2}, greedy=False) for i in range(2)]
    run(model, requests, processor_per_call(store), steps=2, generators=[torch.Generator()] * 2)
    assert set(store._requests) == {"f0", "f1"}
    requests[0].finished_reason = "length"
    store.process(torch.zeros(1, V), [requests[1].custom_params])
    assert set(store._requests) == {"f1"}
    shared = Req("f2", PROMPTS[2], {"repetition_penalty": 1.2})
    store.process(torch.zeros(1, V), [shared.custom_params])
    assert len(store._shared) == 2 and len(store._followed) == 1  # mirostat's chain (followed), and the other
    del requests[:], shared  # SGLang drops the request: its weak proxy dies
    store.process(torch.zeros(0, V), [])
    # the shared samplers go with their last request
    assert store._requests == {} and store._shared == {} and store._followed == {}


def _params(**fields):
    values = dict(temperature=1.0, top_k=1, top_p=1.0, min_p=0.0, frequency_penalty=0.0, presence_penalty=0.0,
                  repetition_penalty=1.0, min_new_tokens=0) | fields
    return SimpleNamespace(**values)


@pytest.mark.parametrize(("custom", "fields", "error", "match"), [
    ({"top_kk": 3}, {}, ValueError, "`top_kk` is not an hfbridge option SGLang requests take. Did you mean `top_k`?"),
    ({"do_sample": True}, {}, ValueError, "`do_sample` is not taken in SGLang: SGLang's `temperature` decides"),
    ({1: 3}, {}, TypeError, "`custom_params` keys must be option names"),
    ({"top_k": [3, 4]}, {"top_k": 1 << 30}, TypeError, "`top_k` takes one value per request"),
    ({"top_k": {"a": 1}}, {"top_k": 1 << 30}, TypeError, "`top_k` must be plain data"),
    ({"repetition_penalty": -1.0}, {}, ValueError, "repetition_penalty"),
    ({"repetition_penalty": "1.2"}, {}, TypeError, "repetition_penalty"),
    ({"dry_multiplier": float("nan")}, {}, ValueError, "dry_multiplier"),
    ({"temperature": 0.7}, {}, ValueError, "`temperature` applies only when sampling"),
    ({"repetition_penalty": 1.2}, {"temperature": 0.7}, ValueError, "SGLang's `temperature`=0.7 with hfbridge"),
    ({"repetition_penalty": 1.2}, {"top_p": 0.9}, ValueError, "SGLang's `top_p`=0.9 with hfbridge options"),
    ({"repetition_penalty": 1.2}, {"frequency_penalty": 0.2}, ValueError, "Pass `frequency_penalty` in"),
    ({"repetition_penalty": 1.2}, {"top_k": 20}, ValueError, "SGLang's `top_k`=20"),
])
def test_bad_options_are_named(custom, fields, error, match):
    with pytest.raises(error, match=re.escape(match)):
        check_params(custom, _params(**fields))


def test_sglangs_own_keys_are_not_options():
    assert check_params({"__req__": object(), "__sglang_reasoning_end_token_ids": [3]}, _params()) is None
    assert check_params(None, _params()) is None
    request = check_params({"top_n_sigma": 1.0, "__req__": None}, _params(top_k=1 << 30))
    assert request is not None and request.do_sample and request.options == {"top_n_sigma": 1.0}
    with pytest.raises(TypeError, match="`custom_params` must be a dict"):
        check_params([("top_k", 3)], _params())  # type: ignore[arg-type]
