"""Hostile inputs: each gets HF's answer or an error naming what was wrong."""

import re

import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper

from hfbridge import build_processors, generate, sample_step
from hfbridge._step.run.processor_list import CheckedProcessorList, check_processor_output

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


# ---- processor outputs ----

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


# ---- explain_step(fast=True) runs each processor once ----

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


# ---- sample_step's sampler cache under threads ----

def test_sampler_cache_is_thread_safe_and_bounded(monkeypatch):
    import sys
    import threading

    from hfbridge._step.run import sample_step as _sample_step

    size = 4
    monkeypatch.setattr(_sample_step, "_SAMPLER_CACHE_SIZE", size)
    x = torch.randn(2, 10, generator=torch.Generator().manual_seed(0))
    errors = []

    def one_round(tag, n_threads=16):
        barrier = threading.Barrier(n_threads)

        def work(thread):
            try:
                barrier.wait()  # all threads reach the cache at about the same time
                assert sample_step(x, temperature=0.5 + thread * 0.01 + tag * 1e-5, top_k=3).shape == (2,)
            except BaseException as error:
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
            _sample_step._SAMPLER_CACHE.clear()
            for i in range(size - 1):  # one free place: every thread wants it
                sample_step(x, temperature=2.0 + i * 0.1, top_k=3)
            one_round(tag)
            assert errors == [] and len(_sample_step._SAMPLER_CACHE) <= size, (tag, errors, len(_sample_step._SAMPLER_CACHE))
    finally:
        sys.setswitchinterval(interval)
        _sample_step._SAMPLER_CACHE.clear()


# ---- option types and ranges (items 7, 8) ----

@pytest.mark.parametrize("options, kind, text", [
    ({"do_sample": "False"}, TypeError, "`do_sample` must be a bool (True or False), got str 'False'."),
    ({"fast": "no"}, TypeError, "`fast` must be a bool (True or False), got str 'no'."),
    ({"renormalize_logits": "no"}, TypeError, "`renormalize_logits` must be a bool (True or False), got str 'no'."),
    ({"prompt_length": True}, TypeError, "`prompt_length` must be an int (the prompt's length in tokens), got bool True."),
    ({"top_k": True}, TypeError, "`top_k` must be an int, got bool True."),
    ({"top_k": 2.0}, TypeError, "`top_k` must be an int, got float 2.0."),
    ({"no_repeat_ngram_size": True}, TypeError, "`no_repeat_ngram_size` must be an int, got bool True."),
    ({"min_length": True, "eos_token_id": 1}, TypeError, "`min_length` must be an int >= 0, got bool True."),
    ({"top_p": NAN}, ValueError, "`top_p` must be a finite number, got nan."),
    ({"epsilon_cutoff": NAN}, ValueError, "`epsilon_cutoff` must be a finite number, got nan."),
    ({"eta_cutoff": NAN}, ValueError, "`eta_cutoff` must be a finite number, got nan."),
    ({"temperature": INF}, ValueError, "`temperature` must be a finite number, got inf."),
    ({"min_p": "0.1"}, TypeError, "`min_p` must be a number, got str '0.1'."),
    ({"sequence_bias": {(1,): NAN}}, ValueError, "`sequence_bias[(1,)]` must be a finite number, got nan."),
    ({"exponential_decay_length_penalty": (2, NAN), "prompt_length": 1, "eos_token_id": 1}, ValueError,
     "`exponential_decay_length_penalty[1] (decay_factor)` must be a finite number, got nan."),
    ({"bad_words_ids": [[True]]}, TypeError, "`bad_words_ids[0][0]` must be a token id (an int), got bool True."),
    ({"suppress_tokens": 5}, TypeError, "`suppress_tokens` must be a list of token ids, got int 5."),
    ({"pad_token_id": -1}, ValueError, "`pad_token_id` must be a token id >= 0, got -1."),
])
def test_option_types_and_ranges(options, kind, text):
    with pytest.raises(kind) as error:
        sample_step(torch.randn(2, 10), **options)
    assert str(error.value) == text


def test_options_inside_a_generation_config_are_checked():
    from transformers import GenerationConfig

    with pytest.raises(ValueError) as error:
        sample_step(torch.randn(2, 10), generation_config=GenerationConfig(do_sample=True, top_p=NAN))
    assert str(error.value) == "`top_p` must be a finite number, got nan (in `generation_config`)."
    model = Counting()
    with pytest.raises(TypeError) as error:
        generate(model, torch.tensor([[1, 2]]), generation_config=GenerationConfig(do_sample="yes", max_new_tokens=2))
    assert str(error.value) == "`do_sample` must be a bool (True or False), got str 'yes' (in `generation_config`)."
    assert model.calls == 0


def test_hf_range_checks_still_run():
    with pytest.raises(ValueError, match=re.escape("`top_p`=1.5 is out of range: `top_p` has to be a float > 0 and < 1")):
        sample_step(torch.randn(2, 10), top_p=1.5)


# ---- a generation_config selecting beam search ----

def test_step_refuses_a_config_with_beams_like_the_keyword():
    from transformers import GenerationConfig

    from hfbridge import Sampler

    with pytest.raises(TypeError, match=re.escape("sample_step() does not use the generation option `num_beams`")):
        sample_step(torch.randn(2, 10), num_beams=4)
    with pytest.raises(TypeError) as error:
        sample_step(torch.randn(2, 10), generation_config=GenerationConfig(num_beams=4, do_sample=True))
    assert str(error.value) == (
        "sample_step() does not use the generation option `num_beams`=4 (set in `generation_config`): it chooses "
        "one token per row (greedy or sampling) with logits processors, and these options select beam sample. "
        "Set `num_beams` back to its default for the step."
    )
    with pytest.raises(TypeError, match=re.escape("`num_beams`=3 (set in `generation_config`)")):
        Sampler(GenerationConfig(num_beams=3))
    with pytest.raises(TypeError, match=re.escape("`num_beams`=3 (set in `generation_config`)")):
        build_processors(GenerationConfig(num_beams=3))


# ---- generate validates every option before the first model call ----

class Counting:
    def __init__(self, vocab=10):
        self.calls = 0
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0))

    def __call__(self, input_ids):
        self.calls += 1
        return self.table[input_ids]


@pytest.mark.parametrize("options, kind, text", [
    ({"eos_token_id": []}, ValueError,
     "`eos_token_id` is an empty list; pass at least one token id, or None for no eos_token_id."),
    ({"eos_token_id": "2"}, TypeError, "`eos_token_id` must be a token id or a non-empty list of them, got str '2'."),
    ({"max_time": "x"}, TypeError, "`max_time` must be a number, got str 'x'."),
    ({"max_time": -1}, ValueError, "`max_time` must be a number > 0, got -1."),
    ({"max_time": NAN}, ValueError, "`max_time` must be a finite number, got nan."),
    ({"num_return_sequences": 0}, ValueError, "`num_return_sequences` must be an int >= 1, got 0."),
    ({"num_return_sequences": -1}, ValueError, "`num_return_sequences` must be an int >= 1, got -1."),
    ({"num_return_sequences": True}, TypeError, "`num_return_sequences` must be an int >= 1, got bool True."),
    ({"pad_token_id": 1.0}, TypeError, "`pad_token_id` must be a token id (an int), got float 1.0."),
    ({"pad_token_id": [1, 2]}, TypeError, "`pad_token_id` must be a token id (an int), got list [1, 2]."),
    ({"min_new_tokens": -1}, ValueError, "`min_new_tokens` must be an int >= 0, got -1."),
    ({"max_length": 0}, ValueError, "`max_length` must be an int >= 1, got 0."),
    ({"stop_strings": 5}, TypeError, "`stop_strings` must be a string or a non-empty list of strings, got int 5."),
    ({"stop_strings": ["ok", ""]}, TypeError, "`stop_strings[1]` must be a non-empty string, got str ''."),
    ({"return_dict_in_generate": "yes"}, TypeError,
     "`return_dict_in_generate` must be a bool (True or False), got str 'yes'."),
    ({"output_attentions": "no"}, TypeError, "`output_attentions` must be a bool (True or False), got str 'no'."),
    ({"progress": "yes"}, TypeError, "`progress` must be a bool (True or False), got str 'yes'."),
    ({"fast": 1}, TypeError, "`fast` must be a bool (True or False), got int 1."),
    ({"do_sample": "False"}, TypeError, "`do_sample` must be a bool (True or False), got str 'False'."),
])
def test_generate_checks_options_before_the_model_runs(options, kind, text):
    model = Counting()
    with pytest.raises(kind) as error:
        generate(model, torch.tensor([[1, 2]]), **{"max_new_tokens": 3, **options})
    assert str(error.value) == text
    assert model.calls == 0


# ---- token ids outside the vocabulary ----

@pytest.mark.parametrize("options, text", [
    ({"suppress_tokens": [3, 100]}, "`suppress_tokens` holds token id 100"),
    ({"eos_token_id": 100, "min_length": 5}, "`eos_token_id` holds token id 100"),
    ({"bad_words_ids": [[3, 12]]}, "`bad_words_ids` holds token id 12"),
    ({"sequence_bias": {(11,): 1.0}}, "`sequence_bias` holds token id 11"),
    ({"forced_bos_token_id": 10}, "`forced_bos_token_id` is token id 10"),
    ({"forced_eos_token_id": [1, 10], "max_length": 3}, "`forced_eos_token_id` holds token id 10"),
    ({"begin_suppress_tokens": [99], "prompt_length": 1}, "`begin_suppress_tokens` holds token id 99"),
])
def test_token_ids_outside_the_vocabulary(options, text):
    with pytest.raises(ValueError) as error:
        sample_step(torch.randn(2, 10), **options)
    assert str(error.value) == f"{text}, outside the vocabulary of 10 tokens (ids must be in [0, 10))."


def test_token_ids_checked_against_the_trimmed_vocabulary_in_generate():
    model = Counting(vocab=12)
    with pytest.raises(ValueError) as error:
        generate(model, torch.tensor([[1, 2]]), max_new_tokens=3, vocab_size=10, eos_token_id=11)
    assert str(error.value) == (
        "generate(): at step 0: `eos_token_id` holds token id 11, outside the vocabulary of 10 tokens "
        "(ids must be in [0, 10))."
    )
    assert model.calls == 1  # the vocabulary is known once the model has answered


# ---- layout helpers ----

def test_from_rows_refuses_a_batch_shape_that_does_not_fit():
    from hfbridge import from_rows

    with pytest.raises(ValueError) as error:
        from_rows(torch.arange(6), (2, 2))
    assert str(error.value) == (
        "`values` must have one row per element of batch_shape (2, 2): expected 4 rows, got 6 rows (shape (6,))."
    )
    with pytest.raises(ValueError, match=re.escape("expected 1 row, got 2 rows (shape (2,))")):
        from_rows(torch.arange(2), ())
    with pytest.raises(ValueError, match=re.escape("expected 3 rows, got 6 rows")):
        from_rows(torch.arange(6), (3,))


def test_to_rows_on_a_list():
    from hfbridge import to_rows

    with pytest.raises(TypeError) as error:
        to_rows([[1.0, 2.0]])
    assert str(error.value) == (
        "`logits` must be a tensor (any layout, e.g. [batch, seq, vocab]), got list; for a model output, take its "
        "logits first (sample_step accepts outputs as they are)."
    )


# ---- a streamer failing on the prompt still ends ----

def test_streamer_failing_on_the_prompt_still_gets_end():
    class Failing:
        ended = 0

        def put(self, value):
            raise RuntimeError("display closed")

        def end(self):
            self.ended += 1

    streamer = Failing()
    with pytest.raises(RuntimeError, match="display closed"):
        generate(bigram(), torch.tensor([[1, 2]]), max_new_tokens=3, streamer=streamer)
    assert streamer.ended == 1


# ---- meta logits; did-you-mean only for plausible misspellings ----

def test_meta_logits():
    with pytest.raises(ValueError) as error:
        sample_step(torch.zeros(2, 5, device="meta"))
    assert str(error.value) == (
        "`logits` of shape (2, 5) are on the meta device: they have a shape but no values, so there is nothing to "
        "choose from. Run the model on a real device (load or materialize its weights first, e.g. "
        "`model.to_empty(device=...)` then load the state dict)."
    )


def test_far_fetched_names_get_no_suggestion():
    with pytest.raises(TypeError) as error:
        generate(bigram(), torch.tensor([[1, 2]]), max_new_tokens=3, features=torch.ones(1, 3))
    assert "Did you mean" not in str(error.value)
    with pytest.raises(TypeError) as error:
        sample_step(torch.randn(2, 10), features=3)
    assert str(error.value) == "sample_step() got an unexpected option `features`."


def test_plausible_misspellings_get_a_suggestion():
    with pytest.raises(TypeError, match=re.escape("Did you mean `temperature`?")):
        generate(bigram(), torch.tensor([[1, 2]]), max_new_tokens=3, temprature=0.7)
    with pytest.raises(TypeError, match=re.escape("Did you mean `attention_mask`?")):
        generate(bigram(), torch.tensor([[1, 2]]), max_new_tokens=3, attn_mask=torch.ones(1, 2))
    with pytest.raises(TypeError) as error:
        sample_step(torch.randn(2, 10), top_P=0.9)
    assert str(error.value) == "sample_step() got an unexpected option `top_P`. Did you mean `top_p`?"


def test_fast_path_checks_the_processors_it_calls():
    def narrower(input_ids, scores):
        return scores[:, :5]

    with pytest.raises(ValueError) as error:
        sample_step(torch.zeros(2, 10), processors=[narrower], temperature=0.7, fast=True)
    assert str(error.value) == (
        "logits processor 0 (narrower) returned scores of shape (2, 5), expected (2, 10) like its input (rows, vocab)."
    )


def test_remove_invalid_values_lets_nan_logits_through_as_hf():
    table = torch.randn(10, 10, generator=torch.Generator().manual_seed(0))
    table[2, 4] = NAN  # after token 2, the model's row holds NaN

    def model(input_ids):
        return table[input_ids]

    with pytest.raises(ValueError, match=re.escape("generate(): at step 0: `logits` contain NaN in row 0")):
        generate(model, torch.tensor([[2]]), max_new_tokens=1)
    out = generate(model, torch.tensor([[2]]), max_new_tokens=1, remove_invalid_values=True)
    assert out[0, 1] == torch.nan_to_num(table[2], nan=0.0).argmax()  # HF's InfNanRemove: NaN -> 0
