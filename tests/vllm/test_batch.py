"""The batch behind the vLLM processor, without vLLM: each row's scores equal `Sampler.process` on that row
alone (the padding never shows), rows follow vLLM's removals, additions and moves, states stay per request,
and a request that fails in the worker is ended without touching the others."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hfbridge import Sampler
from hfbridge.vllm._batch import Batch
from hfbridge.vllm._history import History
from hfbridge.vllm._sampling_params import check_request

V = 40
EOS = 2


def params(options=None, *, temperature=0.0, stops=(EOS,), seed=None, **fields):
    extra = None if options is None else {"hfbridge": options}
    values = dict(top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                  frequency_penalty=0.0) | fields
    return SimpleNamespace(extra_args=extra, temperature=temperature, all_stop_token_ids=set(stops), seed=seed,
                           **values)


def alone(options, prompt, output, logits_row, *, do_sample, **sampler_kwargs):
    """What hfbridge's `Sampler` gives this one row, built for it alone (HF's chain, no padding)."""
    sampler = Sampler(do_sample=do_sample, prompt_length=len(prompt), **sampler_kwargs, **options)
    ids = torch.tensor([list(prompt) + list(output)])
    return sampler.process(ids, logits_row[None].clone())[0]


GREEDY = [
    {"repetition_penalty": 1.5},
    {"no_repeat_ngram_size": 2},
    {"no_repeat_ngram_size": 3, "repetition_penalty": 0.7},
    {"sequence_bias": [[[5], 3.0], [[7, 8], -4.0]]},
    {"bad_words_ids": [[9], [10, 11]]},
    {"suppress_tokens": [3, 4]},
    {"min_new_tokens": 3},
    {"min_length": 9},
    {"begin_suppress_tokens": [12]},
    {"exponential_decay_length_penalty": [1, 1.5]},
    {"dry_multiplier": 0.8, "dry_sequence_breakers": [[13]]},
    {"presence_penalty": 0.5, "frequency_penalty": 0.3},
    {"presence_penalty": 0.5, "frequency_penalty": 0.3, "penalty_last_n": 4},
    {"remove_invalid_values": True, "renormalize_logits": True, "repetition_penalty": 1.2},
]
SAMPLED = [
    {"temperature": 0.7, "top_k": 5},
    {"top_p": 0.8, "top_k": 0},
    {"min_p": 0.1, "typical_p": 0.9},
    {"epsilon_cutoff": 0.02, "eta_cutoff": 0.01},
    {"top_n_sigma": 1.0, "temperature": 1.5},
    {"dynatemp_range": 0.5, "temperature": 0.9},
    {"smoothing_factor": 0.3},
    {"xtc_probability": 1.0, "xtc_threshold": 0.05, "top_k": 0},
    {"repetition_penalty": 1.3, "dry_multiplier": 0.5, "dry_sequence_breakers": [[13]], "top_p": 0.9},
]


def histories(rows: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 20, (int(n),), generator=generator).tolist()
               for n in torch.randint(2, 9, (rows,), generator=generator)]
    outputs = [torch.randint(3, 20, (int(n),), generator=generator).tolist()
               for n in torch.randint(0, 5, (rows,), generator=generator)]
    return prompts, outputs


@pytest.mark.parametrize("options", GREEDY + SAMPLED, ids=lambda o: ",".join(o))
def test_each_row_equals_the_sampler_alone(options):
    do_sample = options in SAMPLED
    prompts, outputs = histories(6)
    logits = torch.randn(7, V, generator=torch.Generator().manual_seed(1)) * 3  # row 6: no options
    batch = Batch(vocab_size=V)
    batch.update(added=[(i, params(options, temperature=1.0 if do_sample else 0.0), prompts[i], outputs[i])
                        for i in range(6)])
    result = batch.apply(logits.clone())
    extra = {"eos_token_id": [EOS]} if any(k in options for k in ("min_new_tokens", "min_length",
                                                                  "exponential_decay_length_penalty")) else {}
    for i in range(6):
        expected = alone({**options, **extra}, prompts[i], outputs[i], logits[i], do_sample=do_sample)
        assert torch.equal(result[i], expected), (i, result[i], expected)
    assert torch.equal(result[6], logits[6])


def test_interleaved_option_sets_each_equal_the_sampler_alone():
    """Two option sets on alternating rows (each group's rows not consecutive), a row without options between."""
    prompts, outputs = histories(7, seed=3)
    sets = [{"xtc_probability": 1.0, "xtc_threshold": 0.05, "top_k": 0}, {"repetition_penalty": 1.3, "top_k": 4}]
    chosen = [sets[0], sets[1], None, sets[0], sets[0], sets[1], sets[0]]
    logits = torch.randn(7, V, generator=torch.Generator().manual_seed(4)) * 3
    batch = Batch(vocab_size=V)
    batch.update(added=[(i, params(chosen[i], temperature=1.0), prompts[i], outputs[i]) for i in range(7)])
    result = batch.apply(logits.clone())
    for i, options in enumerate(chosen):
        expected = logits[i] if options is None else alone(options, prompts[i], outputs[i], logits[i], do_sample=True)
        assert torch.equal(result[i], expected), i


@pytest.mark.parametrize("options", GREEDY + SAMPLED, ids=lambda o: ",".join(o))
def test_histories_are_built_only_for_a_chain_that_reads_them(options, monkeypatch):
    from hfbridge._step.checks.caller_inputs import reads_ids

    do_sample = options in SAMPLED
    prompts, outputs = histories(3)
    batch = Batch(vocab_size=V)
    batch.update(added=[(i, params(options, temperature=1.0 if do_sample else 0.0), prompts[i], outputs[i])
                        for i in range(3)])
    built = []
    monkeypatch.setattr(batch, "_ids", lambda group, padded, ids=batch._ids: built.append(padded) or ids(group, padded))
    batch.apply(torch.randn(3, V))
    extra = {"eos_token_id": [EOS]} if any(k in options for k in ("min_new_tokens", "min_length",
                                                                  "exponential_decay_length_penalty")) else {}
    sampler = Sampler(do_sample=do_sample, prompt_length=len(prompts[0]), **options, **extra)
    assert bool(built) == reads_ids(sampler.processors)
    idless = {"top_p", "top_k", "temperature", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_n_sigma",
              "dynatemp_range", "smoothing_factor", "xtc_probability", "xtc_threshold"}
    assert bool(built) == (not set(options) <= idless)  # by hand: the options whose processors never read ids


def test_a_requests_own_chain_that_never_reads_the_ids_gets_none(monkeypatch):
    """A seeded XTC request has a chain of its own (its coins from its seed); it reads no ids, so none are built."""
    batch = Batch(vocab_size=V)
    options = {"xtc_probability": 1.0, "xtc_threshold": 0.05, "top_k": 0}
    batch.update(added=[(0, params(options, temperature=1.0, seed=5), [3, 4, 5], [6])])
    built = []
    monkeypatch.setattr(batch, "_ids", lambda group, padded, ids=batch._ids: built.append(padded) or ids(group, padded))
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(2)) * 3
    result = batch.apply(logits.clone())
    assert built == [] and not torch.equal(result, logits)  # processed: XTC removed its best tokens


def test_rows_without_options_are_bit_equal_and_not_copied():
    batch = Batch(vocab_size=V)
    batch.update(added=[(0, params(None), [3, 4], []), (1, params({}), [3], [])])
    logits = torch.randn(2, V)
    assert batch.apply(logits) is logits and len(batch) == 0


def test_the_history_grows_with_vllms_output_list():
    output: list[int] = []
    batch = Batch(vocab_size=V)
    batch.update(added=[(0, params({"no_repeat_ngram_size": 2}), [5, 6], output)])
    logits = torch.zeros(1, V)
    assert batch.apply(logits.clone())[0].isinf().sum() == 0  # [5, 6]: no bigram starts with 6 yet
    output += [5]  # [5, 6, 5]: 6 follows 5
    assert batch.apply(logits.clone())[0].isinf().nonzero().flatten().tolist() == [6]
    output += [-1]  # vLLM's placeholder under async scheduling is not a token
    assert batch.apply(logits.clone())[0].isinf().nonzero().flatten().tolist() == [6]


def test_moves_and_swaps_carry_each_request():
    batch = Batch(vocab_size=V)
    batch.update(added=[(0, params({"suppress_tokens": [3]}), [5], []),
                        (1, params({"suppress_tokens": [4]}), [5], []),
                        (2, params({"suppress_tokens": [7]}), [5], [])])
    batch.update(removed=[0], moved=[(1, 0, True), (2, 1, False)])  # 1 <-> 0, then 2 -> 1
    removed = batch.apply(torch.zeros(3, V)).isinf()
    assert removed[0].nonzero().flatten().tolist() == [4]
    assert removed[1].nonzero().flatten().tolist() == [7]
    assert not removed[2].any()


def test_a_new_request_replaces_the_row_it_lands_on():
    batch = Batch(vocab_size=V)
    batch.update(added=[(0, params({"suppress_tokens": [3]}), [5], [])])
    batch.update(added=[(0, params({"suppress_tokens": [4]}), [5], [])])
    assert batch.apply(torch.zeros(1, V))[0].isinf().nonzero().flatten().tolist() == [4]
    assert len(batch.requests._samplers) == 1  # the first request's chain is let go


def test_mirostat_keeps_its_state_per_request_across_moves():
    steps = 4
    logits = torch.randn(steps, 2, V, generator=torch.Generator().manual_seed(3)) * 2
    options = {"mirostat": 2, "mirostat_tau": 2.0, "mirostat_eta": 0.5}
    outputs: list[list[int]] = [[], []]
    prompts = [[5, 6, 7], [8, 9]]
    batch = Batch(vocab_size=V)
    batch.update(added=[(i, params(options, temperature=1.0), prompts[i], outputs[i]) for i in range(2)])
    references = [Sampler(do_sample=True, **options) for _ in range(2)]
    where = [0, 1]  # the row of each request
    for step in range(steps):
        if step == 2:
            batch.update(moved=[(0, 1, True)])
            where = [1, 0]
        result = batch.apply(logits[step].clone())
        for request in range(2):
            ids = torch.tensor([prompts[request] + outputs[request]])
            expected = references[request].process(ids, logits[step, where[request]][None].clone())[0]
            assert torch.equal(result[where[request]], expected), (step, request)
            outputs[request].append(int(expected.argmax()))


def _fail_on_token_39(monkeypatch):
    """`Sampler.process` raises for a call whose ids hold token 39 (a chain failing on one request's tokens); the
    original is returned."""
    process = Sampler.process

    def failing(self, input_ids, scores):
        if (input_ids == 39).any():
            raise ValueError("token 39 met")
        return process(self, input_ids, scores)

    monkeypatch.setattr(Sampler, "process", failing)
    return process


STATEFUL = [{"mirostat": 2, "mirostat_tau": 2.0, "mirostat_eta": 0.5},
            {"mirostat": 1, "mirostat_tau": 3.0, "mirostat_eta": 0.5, "mirostat_m": 20, "top_k": 0},
            {"adaptive_target": 0.3, "adaptive_decay": 0.5, "top_k": 0}]


@pytest.mark.parametrize("options", STATEFUL, ids=["mirostat2", "mirostat1", "adaptive_p"])
def test_requests_sharing_a_state_chain_each_equal_their_own_sampler_as_they_come_move_and_go(options):
    """One chain for the requests of equal stateful options (`follow`), against one `Sampler` per request called
    on that request alone: requests of other lengths (padding), joining late, leaving, swapped, a request whose
    history grew by two tokens between calls (a new state, as its own sampler starts one), and a request of
    other options between them. Every row, every step, bit for bit."""
    other = {"repetition_penalty": 1.3}
    generator = torch.Generator().manual_seed(11)
    batch = Batch(vocab_size=V)
    prompts = {0: [5, 6, 7], 1: [8, 9], 2: [10, 11, 12, 13], 3: [14], 4: [15, 16]}
    outputs: dict[int, list[int]] = {request: [] for request in prompts}
    references = {request: Sampler(do_sample=True, **options) for request in prompts}
    where = {0: 0, 1: 1, 3: 3}  # request -> its row in vLLM's batch
    batch.update(added=[(0, params(options, temperature=1.0), prompts[0], outputs[0]),
                        (1, params(options, temperature=1.0), prompts[1], outputs[1]),
                        (3, params(other), prompts[3], outputs[3])])
    for step in range(9):
        if step == 2:  # a request joins, longer than the others
            batch.update(added=[(2, params(options, temperature=1.0), prompts[2], outputs[2])])
            where[2] = 2
        if step == 4:  # two swap rows
            batch.update(moved=[(0, 2, True)])
            where[0], where[2] = 2, 0
        if step == 5:  # one leaves; another joins in its row
            batch.update(removed=[where.pop(1)])
            batch.update(added=[(1, params(options, temperature=1.0), prompts[4], outputs[4])])
            where[4] = 1
        if step == 7:  # two tokens since the last call: its own sampler starts a new state, so does the chain
            outputs[2].append(3)
        logits = torch.randn(4, V, generator=generator) * 2
        result = batch.apply(logits.clone())
        for request, row in where.items():
            ids = torch.tensor([prompts[request] + outputs[request]])
            if request == 3:
                expected = alone(other, prompts[3], outputs[3], logits[row], do_sample=False)
            else:
                expected = references[request].process(ids, logits[row][None].clone())[0]
            assert torch.equal(result[row], expected), (step, request)
            weights = torch.softmax(expected, -1)
            outputs[request].append(int(torch.multinomial(weights, 1, generator=generator)))
    assert len(batch.requests._samplers) == 2  # the stateful requests' chain, and the other's


def test_a_shared_state_chain_that_fails_ends_every_request_of_it_and_only_them(caplog, monkeypatch):
    options = STATEFUL[0]
    batch = Batch(vocab_size=V)
    batch.update(added=[(0, params(options, temperature=1.0), [5, 39], []),
                        (1, params(options, temperature=1.0), [6], []),
                        (2, params({"repetition_penalty": 1.2}), [6], [])])
    batch.apply(torch.randn(3, V))
    process = _fail_on_token_39(monkeypatch)
    with caplog.at_level(logging.ERROR):
        result = batch.apply(torch.ones(3, V))
    assert caplog.text.count("token 39 met") == 2 and "shared by 2 requests" in caplog.text
    assert [row.isfinite().nonzero().flatten().tolist() for row in result[:2]] == [[EOS], [EOS]]
    assert result[2, 6] == 1 / 1.2 and result[2, 5] == 1  # the other chain's request, as alone
    monkeypatch.setattr(Sampler, "process", process)
    assert batch.requests._samplers.keys() == {batch.requests.rows[2].shared}  # the shared chain is let go
    batch.update(added=[(3, params(options, temperature=1.0), [7], [])])  # the same options again: a new state
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(1))
    expected = Sampler(do_sample=True, **options).process(torch.tensor([[7]]), logits[3][None].clone())[0]
    assert torch.equal(batch.apply(logits.clone())[3], expected)


def test_a_token_id_outside_the_vocabulary_ends_only_that_request(caplog):
    batch = Batch(vocab_size=V)
    with caplog.at_level(logging.ERROR):
        batch.update(added=[(0, params({"suppress_tokens": [V + 5]}), [5], []),
                            (1, params({"suppress_tokens": [3]}), [5], [])])
    assert f"token id {V + 5}" in caplog.text and "suppress_tokens" in caplog.text
    result = batch.apply(torch.zeros(2, V))
    assert result[0].isfinite().nonzero().flatten().tolist() == [EOS]  # only its stop token: it ends now
    assert result[1].isinf().nonzero().flatten().tolist() == [3]


def test_string_breakers_without_a_tokenizer_end_the_request(caplog):
    batch = Batch(vocab_size=V)
    with caplog.at_level(logging.ERROR):
        batch.update(added=[(0, params({"dry_multiplier": 0.8}), [5], [])])
    assert "dry_sequence_breakers" in caplog.text


def test_a_chain_that_fails_at_a_step_ends_only_its_request(caplog, monkeypatch):
    batch = Batch(vocab_size=V)
    batch.update(added=[(0, params({"repetition_penalty": 1.2}), [5, 39], []),
                        (1, params({"repetition_penalty": 1.2}), [6], [])])
    _fail_on_token_39(monkeypatch)
    with caplog.at_level(logging.ERROR):
        result = batch.apply(torch.ones(2, V))
    assert "token 39 met" in caplog.text
    assert result[0].isfinite().nonzero().flatten().tolist() == [EOS]
    assert result[1, 6] == 1 / 1.2 and result[1, 5] == 1  # still penalised, as alone
    assert batch.apply(torch.zeros(2, V))[0].isfinite().nonzero().flatten().tolist() == [EOS]  # stays ended


def test_the_xtc_coin_is_the_same_in_every_worker():
    options = {"xtc_probability": 0.5, "xtc_threshold": 0.05, "top_k": 0}
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(5))
    results = []
    for _ in range(2):  # two workers, built alike
        batch = Batch(vocab_size=V, seed=7)
        batch.update(added=[(i, params(options, temperature=1.0), [5 + i], []) for i in range(4)])
        results.append(torch.stack([batch.apply(logits.clone()) for _ in range(5)]))
    assert torch.equal(results[0], results[1])


def test_history_follows_a_list_that_shrank():
    output = [4, 5, 6]
    history = History([3], output)
    del output[1:]
    history.sync()
    assert history.tokens().tolist() == [3, 4]
    output += list(range(7, 40))  # past the first buffer
    history.sync()
    assert history.tokens().tolist() == [3, 4, *range(7, 40)]


def test_options_as_a_json_string_as_the_openai_server_passes_them():
    batch = Batch(vocab_size=V)
    batch.update(added=[(0, params('{"suppress_tokens": [3]}'), [5], [])])
    assert batch.apply(torch.zeros(1, V))[0].isinf().nonzero().flatten().tolist() == [3]


@pytest.mark.parametrize(("options", "fields", "message"), [
    ('{"top_k": ', {}, "not JSON"),
    ([1, 2], {}, "must be a dict"),
    ({"xtc_probability": np.float32(0.5)}, {"temperature": 1.0}, "plain data"),
    ({"sequence_bias": {(5,): 1.0}}, {}, "plain data"),
    ({"suppress_tokens": [3]}, {"temperature": float("nan")}, "SamplingParams.temperature"),
    ({"suppress_tokens": [3]}, {"min_p": 0.1}, "SamplingParams.min_p"),
    ({"suppress_tokens": [3]}, {"top_k": 5}, "SamplingParams.top_k"),
    ({"suppress_tokens": [3]}, {"frequency_penalty": 0.5}, "SamplingParams.frequency_penalty"),
    ({"suppress_tokens": [3]}, {"repetition_penalty": 1.1}, "SamplingParams.repetition_penalty"),
    ({"guidance_scale": 1.5}, {}, "`guidance_scale`"),
    ({5: 1}, {}, "option names"),
    ({"top_n_sigma": float("nan")}, {"temperature": 1.0}, "top_n_sigma"),
    ({"mirostat": True}, {"temperature": 1.0}, "`mirostat`"),
    ({"dry_multiplier": 0.8, "dry_sequence_breakers": "abc"}, {}, "dry_sequence_breakers"),
])
def test_check_request_names_what_is_wrong(options, fields, message):
    request = params(None, **{"temperature": 0.0, **fields})
    request.extra_args = {"hfbridge": options}
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        check_request(request)


def test_a_big_group_goes_in_slices_on_a_cpu_and_each_row_still_equals_the_sampler_alone():
    vocab = 200_000  # 2 rows per call (`_requests._CPU_CALL_SCORES`)
    options = {"repetition_penalty": 1.3, "top_k": 20}
    prompts, outputs = histories(5)
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(2))
    batch = Batch(vocab_size=vocab)
    batch.update(added=[(i, params(options, temperature=1.0), prompts[i], outputs[i]) for i in range(5)])
    result = batch.apply(logits.clone())
    for i in range(5):
        assert torch.equal(result[i], alone(options, prompts[i], outputs[i], logits[i], do_sample=True))


@pytest.mark.parametrize("options", [
    {"sampler_order": ["temperature", "top_k"], "temperature": 0.5, "top_k": 4},
    {"thinking_budget": 1, "thinking_start": [5], "thinking_end": [8, 9], "thinking_budget_message": [7]},
], ids=["sampler_order", "thinking_tags"])
def test_options_whose_value_is_a_list_are_taken_and_give_the_sampler_alone(options):
    """`sampler_order` and the thinking budget's tags take lists of names or token ids (as every engine)."""
    do_sample = "temperature" in options
    prompts, outputs = [[3, 5], [4, 4, 5]], [[6], [6, 7]]  # each opens a thinking span (5) and spends its budget
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(4))
    batch = Batch(vocab_size=V)
    batch.update(added=[(i, params(options, temperature=1.0 if do_sample else 0.0), prompts[i], outputs[i])
                        for i in range(2)])
    result = batch.apply(logits.clone())
    for i in range(2):
        assert torch.equal(result[i], alone(options, prompts[i], outputs[i], logits[i], do_sample=do_sample))
    forced = [row.isfinite().nonzero().flatten().tolist() for row in result]
    assert "thinking_budget" not in options or forced == [[7], [8]]  # the message, then the end tag after it


@pytest.mark.parametrize(("options", "stateful"), [
    ({"mirostat": 2}, True), ({"mirostat": 1}, True), ({"adaptive_target": 0.3}, True),
    ({"thinking_budget": 2, "thinking_start": [5], "thinking_end": [8]}, True), ({"top_k": 4}, False),
    ({"xtc_probability": 0.5}, False),
])
def test_requests_with_a_state_share_a_chain_only_when_it_can_follow_them(options, stateful):
    """Stateful requests (the `Sampler` says which) share a chain whose stateful processors take `follow` (told
    which request each row is); a thinking budget, which follows its rows by their tokens, gets one per request."""
    assert check_request(params(options, temperature=1.0)).stateful is stateful
    batch = Batch(vocab_size=V)
    batch.update(added=[(i, params(options, temperature=1.0), [5, 6], []) for i in range(2)])
    own = "thinking_budget" in options
    assert len(batch.requests._samplers) == (0 if own else 1)
    assert len(batch.requests._followed) == (1 if stateful and not own else 0)
    assert [row.own is not None for row in batch.requests.rows.values()] == [own, own]


def test_greedy_and_refusals_name_vllms_fields():
    with pytest.raises(ValueError, match=re.escape("`top_p` applies only when sampling, and the request is greedy; "
                                                   "set `SamplingParams(temperature=1.0)` (it is 0)")):
        check_request(params({"top_p": 0.9}))
    with pytest.raises(TypeError, match=re.escape("`extra_args['hfbridge']` keys must be option names (str)")):
        check_request(params({5: 1}))
    with pytest.raises(ValueError, match=re.escape("`thinking_options` is not taken in vLLM")):
        check_request(params({"thinking_options": {"temperature": 0.5}}))
    with pytest.raises(TypeError, match=re.escape("`temperature` takes one value per request, got a list [0.5, 0.7]: "
                                                  "each vLLM request is one row")):
        check_request(params({"temperature": [0.5, 0.7]}, temperature=1.0))
