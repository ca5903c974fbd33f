"""What the step does with the caller's inputs (`caller_inputs.py`, `cpu_shortcuts.ids_outside`, the
processor list's direct calls): the ids copied only when a processor could write them, the id range
checked on every route, HF's processors called as HF's list calls them, the one-row validity."""

import doctest

import pytest
import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge import Sampler, build_processors
from hfbridge._step.checks import caller_inputs as _step_inputs
from hfbridge._step.fast.fast_path import fast_draw
from hfbridge._step.run.cpu_shortcuts import accelerator_route, ids_outside
from hfbridge._step.run.layout import Layout
from hfbridge._step.run.processor_list import CheckedProcessorList

V = 50


def logits_and_ids(seq=6):
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, V, generator=g), torch.randint(0, V, (2, seq), generator=g)


@pytest.mark.parametrize("options", [
    dict(do_sample=False), dict(temperature=0.7, top_k=5, top_p=0.9), dict(min_p=0.1, repetition_penalty=1.3),
    dict(no_repeat_ngram_size=2, bad_words_ids=[[3]], suppress_tokens=[4], typical_p=0.9),
    dict(epsilon_cutoff=0.01, min_length=9, eos_token_id=2, renormalize_logits=True, remove_invalid_values=True),
], ids=lambda o: ",".join(o))
def test_hfs_option_built_processors_get_the_callers_ids(options):
    _assert_the_callers_ids(options)


@pytest.mark.parametrize("options", [
    dict(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.1, penalty_last_n=4, dry_multiplier=0.8,
         dry_sequence_breakers=[]),
    dict(xtc_probability=0.5, xtc_threshold=0.1, top_n_sigma=1.0, dynatemp_range=0.3, smoothing_factor=0.2),
], ids=["penalties,dry", "xtc,top_n_sigma,dynatemp,smoothing"])
def test_hfbridges_stateless_samplers_get_the_callers_ids(options):
    _assert_the_callers_ids(dict(options, do_sample=True))


def test_a_stateful_sampler_gets_a_copy():
    """Mirostat remembers its rows' ids: a caller writing its ids in place must not change what it holds."""
    logits, ids = logits_and_ids()
    sampler = Sampler(do_sample=True, mirostat=2, mirostat_tau=5.0)
    assert not _step_inputs.keeps_ids_intact(sampler.processors)
    assert sampler.prepare(logits, ids)[1].data_ptr() != ids.data_ptr()


def _assert_the_callers_ids(options):
    logits, ids = logits_and_ids()
    assert _step_inputs.keeps_ids_intact(build_processors(**options))
    sampler = Sampler(**options)
    _, rows, _ = sampler.prepare(logits, ids)
    assert rows.data_ptr() == ids.data_ptr()  # no copy: nothing writes them
    before = ids.clone()
    sampler(logits, ids)
    assert torch.equal(ids, before)


class Subclass(hf.TemperatureLogitsWarper):
    def __call__(self, input_ids, scores):
        input_ids[:, 0] = 0
        return super().__call__(input_ids, scores)


def test_processors_that_could_write_the_ids_get_a_copy():
    logits, ids = logits_and_ids()
    before = ids.clone()
    allowed = [hf.PrefixConstrainedLogitsProcessor(lambda batch_id, sent: [1, 2], num_beams=1)]
    for processors in ([lambda input_ids, scores: scores], [Subclass(0.5)], allowed):
        assert not _step_inputs.keeps_ids_intact(processors)
        sampler = Sampler(processors=processors, do_sample=False)
        assert sampler.prepare(logits, ids)[1].data_ptr() != ids.data_ptr()
        sampler(logits, ids)
        assert torch.equal(ids, before)
    assert _step_inputs.keeps_ids_intact([])


@pytest.mark.parametrize("seq", [6, 2000])  # a Python list up to 64 ids, numpy's maximum above
@pytest.mark.parametrize("bad", [-1, V, 10**12, -(2**63)])
def test_ids_outside_the_vocabulary_on_every_route(seq, bad):
    _, ids = logits_and_ids(seq)
    assert not ids_outside(ids, V)
    ids[1, seq // 2] = bad
    assert ids_outside(ids, V)
    with accelerator_route():
        assert ids_outside(ids, V)
    logits, _ = logits_and_ids()
    with pytest.raises(ValueError, match=f"`input_ids` hold token id {bad}, outside the vocabulary of {V} tokens"):
        Sampler(do_sample=False)(logits, ids)


@pytest.mark.parametrize("fast", [False, True])
def test_a_call_like_the_last_one_is_checked_as_the_first(fast):
    """`prepare` skips the checks the shapes, dtypes and devices decide when they are the last call's: every
    check that depends on anything else still runs, and a changed layout or generator is seen."""
    logits, ids = logits_and_ids()
    sampler = Sampler(temperature=0.7, top_k=5, fast=fast, generator=torch.Generator().manual_seed(0))
    first = sampler(logits, ids)
    assert sampler._known_call is not None
    again = Sampler(temperature=0.7, top_k=5, fast=fast, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again(logits, ids), first) and torch.equal(again(logits, ids), sampler(logits, ids))
    for bad in (-1, V):  # the ids' values, every call
        wrong = ids.clone()
        wrong[0, 2] = bad
        with pytest.raises(ValueError, match=f"`input_ids` hold token id {bad}, outside the vocabulary of {V}"):
            sampler(logits, wrong)
    longer = torch.cat([ids, ids], dim=1)  # another length: the same signature
    assert sampler(logits, longer).shape == (2,)
    with pytest.raises(TypeError, match="`input_ids` must hold integer token ids"):  # another dtype
        sampler(logits, ids.bool())
    with pytest.raises(ValueError, match=r"`input_ids` of shape \(3, 6\) do not match the logits"):
        sampler(logits, torch.cat([ids, ids[:1]]))
    sampler.layout = Layout("t b v")  # a layout set since: the new one decides (3 rows of 2 positions)
    with pytest.raises(ValueError, match=r"expected \(3, 'seq'\)"):
        sampler(logits, ids)
    sampler.layout = "t b v"  # a pattern too, although the default for 3 axes was parsed before
    with pytest.raises(ValueError, match=r"expected \(3, 'seq'\)"):
        sampler(logits, ids)
    sampler.layout = None
    assert sampler(logits, ids).shape == (2,)
    def per_row():
        return [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)]
    copied = sampler.with_generator(per_row())  # a copy knows the last call: its own generators still draw
    fresh = Sampler(temperature=0.7, top_k=5, fast=fast, generator=per_row())
    assert torch.equal(copied(logits, ids), fresh(logits, ids))
    with pytest.raises(ValueError, match="`generator` is a list of 2 generators, one per row, but the step has 1"):
        copied(logits[:1], ids[:1])
    unbatched = Sampler(temperature=0.7, top_k=5, fast=fast)
    unbatched(logits, ids)
    with pytest.raises(ValueError, match="are on the meta device"):  # another device
        unbatched(logits.to("meta"), ids)
    assert unbatched(logits[0, -1], ids[0]).shape == ()
    with pytest.raises(ValueError, match="do not match the logits"):  # 0-d ids after 1-d ones
        unbatched(logits[0, -1], ids[0, 0])


class WithStep:
    """A processor with an extra argument, which HF's list passes from its keyword arguments."""

    def __call__(self, input_ids, scores, step):
        return scores + step


def test_hfs_processors_are_called_as_hfs_list_calls_them():
    scores = torch.randn(2, V, generator=torch.Generator().manual_seed(1))
    made = [hf.TemperatureLogitsWarper(0.7), hf.TopKLogitsWarper(5), hf.RepetitionPenaltyLogitsProcessor(1.2)]
    ids = torch.tensor([[1, 2], [3, 3]])
    assert torch.equal(CheckedProcessorList(made)(ids, scores.clone()), LogitsProcessorList(made)(ids, scores.clone()))
    assert torch.equal(CheckedProcessorList([WithStep()])(ids, scores.clone(), step=1.0), scores + 1.0)
    with pytest.raises(ValueError, match="Make sure that all the required parameters"):  # HF's own error
        CheckedProcessorList([WithStep()])(ids, scores.clone())
    own = hf.TemperatureLogitsWarper(0.5)
    own.__call__ = lambda input_ids, scores: scores * 0  # an instance's own __call__: HF's list never uses it
    assert torch.equal(CheckedProcessorList([own])(ids, scores.clone()), scores / 0.5)


def test_one_row_validity_known_on_the_host():
    x = torch.randn(1, 300, generator=torch.Generator().manual_seed(2))
    processors = [hf.TemperatureLogitsWarper(0.7), hf.TopKLogitsWarper(5)]
    out = fast_draw(None, x.clone(), processors)
    assert out.known_valid is True and out.valid.tolist() == [True]
    x[0, 4] = float("nan")
    bad = fast_draw(None, x.clone(), processors)
    assert bad.known_valid is False and bad.valid.tolist() == [False]
    two = fast_draw(None, torch.cat([x, x]), processors)
    assert two.known_valid is None and two.valid.tolist() == [False, False]
    sampler = Sampler(temperature=0.7, top_k=5, fast=True)
    sampler.next_tokens(torch.zeros(1, 0, dtype=torch.long), x[:, :4].clone() + torch.arange(4.0), check=False)
    assert sampler.invalid_rows.tolist() == [False]
    sampler.next_tokens(torch.zeros(1, 0, dtype=torch.long), x.clone(), check=False)
    assert sampler.invalid_rows.tolist() == [True]
    with pytest.raises(ValueError, match="`logits` contain NaN in row 0"):
        sampler.check_rows()


def test_docstring_examples():
    failures, tried = doctest.testmod(_step_inputs)
    assert tried >= 3 and failures == 0
