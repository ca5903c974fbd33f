"""The fast path's rows that cannot be sampled: exact mode's errors, a device flag, no silent token."""

import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge import Sampler, generate, sample_step
from hfbridge._step.fast.fast_path import fast_draw

NAN, INF = float("nan"), float("inf")
BOTH = pytest.mark.parametrize("candidates", [True, False], ids=["candidates", "fixed-shape"])
CONFIGS = [
    dict(top_p=0.9, top_k=0),
    dict(temperature=0.7, top_p=0.9, top_k=0),
    dict(top_k=3),
    dict(temperature=0.7, top_k=20, top_p=0.9),
    dict(temperature=0.8, min_p=0.1, top_k=0),
    dict(temperature=0.5, top_k=0),
    dict(repetition_penalty=1.3, top_k=0, top_p=0.95),
]


def error_of(action):
    """The (type, message) an action raises."""
    with pytest.raises(Exception) as info:
        action()
    return type(info.value), str(info.value)


def rows(seed=0, batch=4, vocab=300):
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed))


def same_error_as_exact(logits, **options):
    """Fast mode raises exactly exact mode's error; returns it."""
    exact = error_of(lambda: sample_step(logits, torch.zeros(logits.shape[0], 2, dtype=torch.long),
                                         do_sample=True, **options))
    fast = error_of(lambda: sample_step(logits, torch.zeros(logits.shape[0], 2, dtype=torch.long),
                                        do_sample=True, fast=True, **options))
    assert fast == exact
    return fast


@pytest.mark.parametrize("options", CONFIGS, ids=str)
def test_nan_from_the_model_is_exact_modes_error(options):
    x = rows()
    x[2, 7] = NAN
    kind, message = same_error_as_exact(x, **options)
    assert kind is ValueError and "NaN in row 2" in message


class Poison:
    """A user processor that writes one value into one row."""

    def __init__(self, row, value, column=None):
        self.row, self.value, self.column = row, value, column

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        if self.column is None:
            scores[self.row] = self.value
        else:
            scores[self.row, self.column] = self.value
        return scores


@pytest.mark.parametrize("options", CONFIGS, ids=str)
def test_nan_from_a_processor_is_exact_modes_error(options):
    kind, message = same_error_as_exact(rows(1), processors=[Poison(1, NAN, column=5)], **options)
    assert kind is ValueError and "row 1" in message


@pytest.mark.parametrize("options", CONFIGS, ids=str)
def test_emptied_rows_are_exact_modes_error(options):
    x = rows(2)
    x[3] = -INF  # all -inf from the model
    kind, message = same_error_as_exact(x, **options)
    assert kind is ValueError and "row 3" in message
    # a processor that removes every token of a row
    kind, message = same_error_as_exact(rows(3), processors=[Poison(0, -INF)], **options)
    assert kind is ValueError and "row 0" in message


def test_bad_words_covering_the_vocabulary():
    x = rows(4, batch=2, vocab=6)
    kind, message = same_error_as_exact(x, bad_words_ids=[[i] for i in range(6)], top_k=0, top_p=0.9)
    assert kind is ValueError and "removed every token of row 0" in message


@pytest.mark.parametrize("options", CONFIGS, ids=str)
def test_plus_inf_while_sampling_raises_naming_the_row(options):
    x = rows(5)
    x[3, 11] = INF
    with pytest.raises(ValueError, match="row 3"):
        sample_step(x, do_sample=True, fast=True, **options)
    exact = error_of(lambda: sample_step(x, torch.zeros(4, 2, dtype=torch.long), do_sample=True, **options))
    if exact[0] is ValueError:  # exact mode's own +inf error: then the very same text
        assert exact == error_of(lambda: sample_step(x, torch.zeros(4, 2, dtype=torch.long), do_sample=True,
                                                     fast=True, **options))


def test_plus_inf_greedy_keeps_hfs_argmax():
    x = rows(6)
    x[1, 42] = INF
    for fast in (False, True):
        assert sample_step(x, fast=fast).tolist()[1] == 42


def test_a_temperature_overflowing_to_inf_is_flagged():
    x = torch.tensor([[1e38, 0.0, -1.0]])  # / 0.01 overflows: HF's scores hold +inf
    processors = [hf.TemperatureLogitsWarper(0.01), hf.TopKLogitsWarper(2)]
    for candidates in (True, False):
        out = fast_draw(None, x.clone(), processors, candidates=candidates)
        assert out.valid.tolist() == [False]
        assert bool(torch.isposinf(out.final_scores()).any())


@BOTH
@pytest.mark.parametrize("chain", [
    [hf.TemperatureLogitsWarper(0.7), hf.TopPLogitsWarper(0.9)],
    [hf.TopKLogitsWarper(5)],
    [hf.TopKLogitsWarper(50), hf.TopPLogitsWarper(0.9)],
    [hf.MinPLogitsWarper(0.1)],
    [hf.TopPLogitsWarper(0.9, min_tokens_to_keep=2)],
    [hf.RepetitionPenaltyLogitsProcessor(1.2)],
    [],
], ids=lambda chain: "+".join(type(p).__name__[:8] for p in chain) or "none")
def test_flag_marks_exactly_the_bad_rows(candidates, chain):
    x = torch.randn(6, 3000, generator=torch.Generator().manual_seed(12))
    x[1] = -INF
    x[2, 17] = NAN
    x[4, 2999] = INF
    ids = torch.zeros(6, 1, dtype=torch.long)
    out = fast_draw(ids, x.clone(), LogitsProcessorList(chain), torch.Generator().manual_seed(0),
                    candidates=candidates)
    assert out.valid.tolist() == [True, False, False, True, False, True]
    assert bool(((out.tokens >= 0) & (out.tokens < 3000)).all())
    # The filters leave the cause of each bad row in place, as HF's do.
    final = out.final_scores()
    assert bool((final[1] == -INF).all())
    assert bool(torch.isnan(final[2]).any()) and bool(torch.isposinf(final[4]).any())


class CountSyncs(TorchDispatchMode):
    """Counts the ops that read a device value on the host."""

    SYNCING = {"_local_scalar_dense", "nonzero", "item", "equal", "is_nonzero"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in self.SYNCING:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_fixed_shape_path_and_flag_read_no_device_value():
    x = torch.randn(4, 2000, generator=torch.Generator().manual_seed(13))
    x[2] = -INF
    chain = [hf.TemperatureLogitsWarper(0.7), hf.TopKLogitsWarper(40), hf.TopPLogitsWarper(0.9),
             hf.MinPLogitsWarper(0.02)]
    for processors in (chain, chain[:1] + chain[2:3], chain[3:]):
        with CountSyncs() as counter:
            out = fast_draw(None, x.clone(), processors, candidates=False)
        assert counter.count == 0
        assert out.valid.tolist() == [True, True, False, True]


def test_sampler_keeps_the_flag_until_check_rows_reads_it():
    sampler = Sampler(top_p=0.9, top_k=0, fast=True)
    x = rows(7)
    ids = torch.zeros(4, 1, dtype=torch.long)
    sampler.next_tokens(ids, x, check=False)
    assert sampler.invalid_rows.tolist() == [False] * 4
    sampler.check_rows()  # nothing to raise
    x[2] = -INF
    tokens = sampler.next_tokens(ids, x, check=False)  # no read, no error yet
    assert tokens.shape == (4,) and sampler.invalid_rows.tolist() == [False, False, True, False]
    with pytest.raises(ValueError, match="removed every token of row 2"):
        sampler.check_rows()
    sampler.check_rows()  # read once: the kept scores are released
    sampler.next_tokens(ids, x, check=False)
    sampler.check_rows(invalid=False)  # the caller read the flag itself: no second read, no error
    with pytest.raises(ValueError, match="row 2"):
        sampler.next_tokens(ids, x)  # on CPU the default reads at once
    with pytest.raises(ValueError, match="row 2"):
        sampler(x)


def test_caller_tensors_untouched_on_the_error_path():
    x = rows(8)
    x[0, 3] = INF
    before = x.clone()
    with pytest.raises(ValueError):
        sample_step(x, top_p=0.9, top_k=0, fast=True)
    assert torch.equal(x, before)


V = 32
PROMPT = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])


def _model_with_fault(fault, at_step):
    calls = []

    def model(idx):
        calls.append(1)
        logits = torch.randn(idx.shape[0], idx.shape[1], V, generator=torch.Generator().manual_seed(len(calls)))
        return fault(logits) if len(calls) == at_step + 1 else logits

    return model


@pytest.mark.parametrize("fast", [False, True], ids=["exact", "fast"])
def test_generate_names_the_step_and_row(fast):
    class EmptyAtStep:
        def __init__(self):
            self.calls = 0

        def __call__(self, input_ids, scores):
            self.calls += 1
            if self.calls == 3:
                scores = scores.clone()
                scores[1] = -INF
            return scores

    with pytest.raises(ValueError, match=re.escape("generate(): at step 2: the logits processors")) as info:
        generate(lambda idx: torch.randn(idx.shape[0], idx.shape[1], V), PROMPT, max_new_tokens=5,
                 do_sample=True, top_p=0.9, processors=[EmptyAtStep()], fast=fast)
    assert "row 1" in str(info.value)

    def inf_row(logits):
        logits[0, -1, 4] = INF
        return logits

    if not fast:
        return  # exact mode's +inf error (tests/step/test_trust.py)
    with pytest.raises(ValueError, match=re.escape("generate(): at step 1: ")) as info:
        generate(_model_with_fault(inf_row, at_step=1), PROMPT, max_new_tokens=5, do_sample=True, top_k=5, fast=fast)
    assert "row 0" in str(info.value) and "inf" in str(info.value)


@pytest.mark.parametrize("options", [
    dict(temperature=0.7, top_p=0.9, top_k=0), dict(top_p=0.9, top_k=0), dict(temperature=1.0, top_p=0.95, top_k=0),
    dict(temperature=0.8, min_p=0.05, top_k=0), dict(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05),
    dict(temperature=0.7, top_p=0.3, top_k=0),
    dict(temperature=[0.6, 0.9, 1.2, 0.7], top_p=[0.9, 0.8, 0.95, 0.6], top_k=0),
], ids=lambda options: str(sorted(options.items())))
@pytest.mark.parametrize("kind", ["nan", "inf", "all -inf"])
def test_a_bad_row_after_earlier_steps_raises_as_at_the_first(options, kind):
    """After steps that taught the sampler where its cuts lie (the next step's candidates are the tokens above a
    floor, chosen by comparison, which leaves NaN out), a row with NaN, +inf or nothing left still raises
    exact mode's error naming it: it used to get a token from the candidates (rows with NaN, 4 rows, top-p)."""
    from _zipf import zipf

    def rows(step):  # Zipf-like and flat rows
        flat = torch.randn(2, 4096, generator=torch.Generator().manual_seed(step)) * 2
        return torch.cat([zipf(2, 4096, seed=step), flat])

    ids = torch.zeros(4, 1, dtype=torch.long)
    for row, place in [(0, 5), (3, 2000)]:
        sampler = Sampler(fast=True, do_sample=True, generator=torch.Generator().manual_seed(0), **options)
        for step in range(3):
            sampler(rows(step), ids)
        bad = rows(9)
        if kind == "all -inf":
            bad[row] = -INF
        else:
            bad[row, place] = NAN if kind == "nan" else INF
        with pytest.raises(ValueError, match=rf"\brow {row}\b"):
            sampler(bad, ids)
