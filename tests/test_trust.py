"""Hostile inputs (issue 8): each gets HF's answer or an error naming what was wrong."""

import re

import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper

from hfbridge import build_processors, generate, sample_step
from hfbridge._processor_list import CheckedProcessorList, check_processor_output

INF, NAN = float("inf"), float("nan")


def bigram(vocab=10, seed=0):
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed))

    def model(input_ids):  # [B, T] -> [B, T, V]
        return table[input_ids]

    return model


# ---- +inf and NaN rows (exact mode) ----

def test_plus_inf_while_sampling_names_the_row():
    x = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    x[1, 4] = INF
    with pytest.raises(ValueError) as error:
        sample_step(x, temperature=0.7)
    assert str(error.value) == (
        "`logits` contain +inf in row 1 (1 of 3 rows) while sampling: softmax of +inf is NaN, so no token can be "
        "drawn (greedy decoding takes the +inf token, as HF's argmax). +inf usually means an fp16 overflow in the "
        "model: compute the last layer in float32, or clamp the logits."
    )


def test_plus_inf_when_greedy_is_hf_argmax():
    x = torch.zeros(2, 10)
    x[1, 7] = INF
    assert sample_step(x).tolist() == [0, 7]


def test_plus_inf_made_by_a_processor():
    def overflow(input_ids, scores):
        return scores.index_fill(1, torch.tensor([2]), INF)

    with pytest.raises(ValueError, match=re.escape(
            "the logits processors ['overflow', 'TemperatureLogitsWarper', 'TopKLogitsWarper'] left +inf in row 0 "
            "(2 of 2 rows) while sampling")):
        sample_step(torch.zeros(2, 10), processors=[overflow], temperature=0.5)


def test_nan_made_by_a_processor_is_not_blamed_on_the_model():
    def nan_maker(input_ids, scores):
        return scores * torch.tensor(NAN)

    with pytest.raises(ValueError) as error:
        sample_step(torch.zeros(2, 10), processors=[nan_maker])
    assert str(error.value) == (
        "the logits processors ['nan_maker'] turned row 0 into NaN (2 of 2 rows); the logits were finite, so a "
        "processor divided by zero or subtracted inf from inf."
    )


def test_plus_inf_in_generate_names_the_step():
    table = torch.randn(10, 10, generator=torch.Generator().manual_seed(0))
    table[3, 5] = INF

    def model(input_ids):
        return table[input_ids]

    with pytest.raises(ValueError, match=re.escape("generate(): at step 0: `logits` contain +inf in row 0 (1 of 1 rows)")):
        generate(model, torch.tensor([[3]]), max_new_tokens=2, do_sample=True)


# ---- processor outputs (item 10) ----

def test_checked_list_keeps_hf_items_and_equality():
    warper = TemperatureLogitsWarper(0.5)
    checked = CheckedProcessorList([warper])
    assert isinstance(checked, LogitsProcessorList) and checked == [warper] and checked == LogitsProcessorList([warper])
    assert type(build_processors(temperature=0.5)) is CheckedProcessorList


@pytest.mark.parametrize("returned, kind, text", [
    (lambda s: None, TypeError,
     "logits processor 0 (bad) returned None; a processor must return the scores, `(input_ids, scores) -> scores` "
     "(one that edits them in place still ends with `return scores`)."),
    (lambda s: torch.cat([s, s], dim=1), ValueError,
     "logits processor 0 (bad) returned scores of shape (2, 20), expected (2, 10) like its input (rows, vocab)."),
    (lambda s: s[:1], ValueError,
     "logits processor 0 (bad) returned scores of shape (1, 10), expected (2, 10) like its input (rows, vocab)."),
    (lambda s: s.double(), TypeError,
     "logits processor 0 (bad) returned scores of dtype torch.float64, expected torch.float32 like its input."),
    (lambda s: s.to("meta"), ValueError,
     "logits processor 0 (bad) returned scores on meta, expected cpu like its input."),
    (lambda s: s.tolist(), TypeError,
     "logits processor 0 (bad) returned list, expected the scores as a tensor of shape (2, 10)."),
])
def test_processor_output_is_checked(returned, kind, text):
    def bad(input_ids, scores):
        return returned(scores)

    with pytest.raises(kind) as error:
        sample_step(torch.zeros(2, 10), processors=[bad])
    assert str(error.value) == text


def test_processor_output_in_generate_names_the_step():
    calls = []

    def wider_later(input_ids, scores):
        calls.append(1)
        return scores if len(calls) < 3 else torch.cat([scores, scores], dim=1)

    with pytest.raises(ValueError) as error:
        generate(bigram(), torch.tensor([[1, 2]]), max_new_tokens=5, processors=[wider_later])
    assert str(error.value) == (
        "generate(): at step 2: logits processor 0 (wider_later) returned scores of shape (1, 20), expected (1, 10) "
        "like its input (rows, vocab)."
    )


def test_check_function_for_processors_run_elsewhere():
    scores = torch.zeros(2, 3)
    assert check_processor_output(TemperatureLogitsWarper(2.0), scores, scores) is scores
    with pytest.raises(TypeError, match=re.escape("logits processor TemperatureLogitsWarper returned None")):
        check_processor_output(TemperatureLogitsWarper(2.0), scores, None)


# ---- explain_step(fast=True) runs each processor once (item 6) ----

@pytest.mark.parametrize("fast", [False, True])
def test_explain_step_calls_a_stateful_processor_once(fast):
    from hfbridge import explain_step

    calls = []

    def counting(input_ids, scores):
        calls.append(1)
        return scores + torch.arange(scores.shape[1], dtype=scores.dtype)  # deterministic: same for both runs

    x = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    trace = explain_step(x, processors=[counting], temperature=0.7, top_p=0.9, fast=fast,
                         generator=torch.Generator().manual_seed(5), row=1)
    assert len(calls) == 1
    expected = sample_step(x, processors=[counting], temperature=0.7, top_p=0.9, fast=fast,
                           generator=torch.Generator().manual_seed(5))
    assert trace.token == int(expected[1])


# ---- sample_step's sampler cache under threads (item 5) ----

def test_sampler_cache_is_thread_safe_and_bounded(monkeypatch):
    import sys
    import threading

    from hfbridge import _step

    size = 4
    monkeypatch.setattr(_step, "_SAMPLER_CACHE_SIZE", size)
    x = torch.randn(2, 10, generator=torch.Generator().manual_seed(0))
    errors = []

    def one_round(tag, n_threads=16):
        barrier = threading.Barrier(n_threads)

        def work(thread):
            try:
                barrier.wait()  # all threads reach the cache at about the same time
                assert sample_step(x, temperature=0.5 + thread * 0.01 + tag * 1e-5, top_k=3).shape == (2,)
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: provokes the race
    try:
        for tag in range(80):  # the unlocked cache overflowed in about one round of ten
            _step._SAMPLER_CACHE.clear()
            for i in range(size - 1):  # one free place: every thread wants it
                sample_step(x, temperature=2.0 + i * 0.1, top_k=3)
            one_round(tag)
            assert errors == [] and len(_step._SAMPLER_CACHE) <= size, (tag, errors, len(_step._SAMPLER_CACHE))
    finally:
        sys.setswitchinterval(interval)
        _step._SAMPLER_CACHE.clear()
