"""`hfbridge.sglang.HFBridgeLogitProcessor` against SGLang's own module (skipped where SGLang is not installed):
a `CustomLogitProcessor`, sent as `to_str()` and made again with `from_str()` for every batch, driven as
SGLang's sampler drives it (`_driver.py`), with SGLang's own `SamplingParams`: `hfbridge.generate`'s tokens."""

from __future__ import annotations

import json

import pytest
import torch
from _cases import EOS, PROMPTS, SAMPLING, expected
from _driver import Req, run

custom_logit_processor = pytest.importorskip("sglang.srt.sampling.custom_logit_processor")
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from hfbridge.sglang import HFBridgeLogitProcessor  # noqa: E402


def test_it_is_sglangs_interface_and_survives_to_str():
    assert issubclass(HFBridgeLogitProcessor, custom_logit_processor.CustomLogitProcessor)
    text = HFBridgeLogitProcessor.to_str()
    assert set(json.loads(text)) == {"callable"}
    first, second = (custom_logit_processor.CustomLogitProcessor.from_str(text) for _ in range(2))
    assert type(first) is HFBridgeLogitProcessor and first is not second  # a new instance each time
    assert first.requests is second.requests is HFBridgeLogitProcessor.requests  # what they keep is shared


@pytest.mark.parametrize("do_sample", [False, True])
def test_tokens_equal_hfbridge_generate(model, do_sample):
    text = HFBridgeLogitProcessor.to_str()
    options = SAMPLING if do_sample else [{"repetition_penalty": 1.4, "no_repeat_ngram_size": 2},
                                          {"dry_multiplier": 0.8, "dry_allowed_length": 1,
                                           "dry_sequence_breakers": [[7]]}]
    cases = [(prompt, options[i % len(options)]) for i, prompt in enumerate(PROMPTS)]
    requests = [Req(f"p{do_sample}{i}", prompt, opts, eos=[EOS],
                    sampling_params=SamplingParams(temperature=1.0 if do_sample else 0.0, custom_params=opts))
                for i, (prompt, opts) in enumerate(cases)]
    generators = [torch.Generator().manual_seed(200 + i) for i in range(len(cases))]
    outputs = run(model, requests, lambda: custom_logit_processor.CustomLogitProcessor.from_str(text), steps=6,
                  generators=generators)
    for i, ((prompt, opts), output) in enumerate(zip(cases, outputs, strict=True)):
        assert output == expected(model, prompt, opts, do_sample=do_sample, steps=6, seed=200 + i), (i, opts)


def test_check_params_before_sending():
    HFBridgeLogitProcessor.check_params({"top_n_sigma": 1.0}, {"temperature": 1.0})
    with pytest.raises(ValueError, match="`top_n_sigma` applies only when sampling"):
        HFBridgeLogitProcessor.check_params({"top_n_sigma": 1.0}, {"temperature": 0.0})
    with pytest.raises(ValueError, match="SGLang's `top_p`=0.5"):
        HFBridgeLogitProcessor.check_params({"top_n_sigma": 1.0}, {"top_p": 0.5})


def test_a_bad_request_is_aborted_with_the_options_name(model):
    schedule_batch = pytest.importorskip("sglang.srt.managers.schedule_batch")  # needs SGLang's full dependencies
    text = HFBridgeLogitProcessor.to_str()
    good = Req("abort-good", PROMPTS[0], {"repetition_penalty": 1.3})
    bad = Req("abort-bad", PROMPTS[1], {"xtc_probabilty": 0.5})
    outputs = run(model, [good, bad], lambda: custom_logit_processor.CustomLogitProcessor.from_str(text), steps=3)
    assert isinstance(bad.finished_reason, schedule_batch.FINISH_ABORT) and outputs[1] == []
    assert bad.finished_reason.status_code == 400
    assert "`xtc_probabilty` is not an hfbridge option SGLang requests take" in bad.finished_reason.message
    assert outputs[0] == expected(model, PROMPTS[0], {"repetition_penalty": 1.3}, do_sample=False, steps=3)
