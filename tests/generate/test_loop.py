"""The decoding loop of `generate` (`_loop.py`, `_finished.py`, `_lockstep.py`): host reads per step,
`check_every` (same tokens for every value), the deferred validity checks, and `synced_gpus` over
torch.distributed with two gloo processes.
"""

from __future__ import annotations

import doctest
import re

import pytest
import torch
from _host_reads import HostReads
from _two_ranks import run_two_ranks
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TextStreamer,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import hfbridge._generate.finished
import hfbridge._generate.lockstep
import hfbridge._step.run.cpu_shortcuts
from hfbridge import InputPos, ReturnsCache, generate
from hfbridge._step.fast.fast_path import fast_draw
from hfbridge._step.run.cpu_shortcuts import accelerator_route, greedy_choice

from _tiny_models import char_tokenizer

pytestmark = [
    pytest.mark.usefixtures("one_thread", "quiet_hf"),
    # These prompts hold token 0, also the pad id, as a real token: the models here read every token (no mask)
    pytest.mark.filterwarnings("ignore:`pad_token_id` appears in the prompt:UserWarning"),
]

V = 32
EOS = 9


class Table:
    """A plain model from a fixed random table: `model(idx) -> logits [B, T, V]`; counts its calls."""

    def __init__(self, seed=0):
        self.table = torch.randn(V, V, generator=torch.Generator().manual_seed(seed))
        self.calls = 0

    def __call__(self, idx):
        self.calls += 1
        return self.table[idx]


class Successor:
    """Greedy picks `last + 1`: a row ending in token t reaches EOS after EOS - t steps."""

    def __init__(self):
        self.calls = 0

    def __call__(self, idx):
        self.calls += 1
        return torch.nn.functional.one_hot((idx + 1) % V, V).float() * 4.0  # [B, T, V]


def reads_per_step(model_factory, prompt, **options) -> float:
    """Host reads of one decode step on the route an accelerator runs (each read there is a sync):
    the difference between two lengths, so that the per-call reads (argument checks, the prompt's
    id range) cancel. (On CPU eager, `_step/run/cpu_shortcuts.py`'s shortcuts read CPU memory besides.)"""
    counts = []
    for new in (6, 14):
        with HostReads() as reads, accelerator_route():
            generate(model_factory(), prompt, max_new_tokens=new, min_new_tokens=new, **options)
        counts.append(reads.count)
    return (counts[1] - counts[0]) / 8


PROMPT = torch.tensor([[1, 2, 3], [4, 5, 6]])


class Wide:
    """A table model over 4096 tokens: wide enough for the fast path's candidate route on CPU."""

    def __init__(self):
        self.table = torch.randn(64, 4096, generator=torch.Generator().manual_seed(1))

    def __call__(self, idx):
        return self.table[idx % 64]


FAST = dict(do_sample=True, temperature=0.7, fast=True)


@pytest.mark.parametrize("options", [
    dict(),
    dict(eos_token_id=EOS),
    dict(eos_token_id=EOS, repetition_penalty=1.3, suppress_tokens=[4]),  # (4.46's no_repeat_ngram reads ids)
    dict(do_sample=True, temperature=0.7, top_k=0, fast=True),
    dict(do_sample=True, temperature=0.7, top_k=0, min_p=0.1, eos_token_id=EOS, fast=True),
], ids=["greedy", "greedy+eos", "greedy+processors", "fast", "fast+min_p+eos"])
def test_at_most_one_host_read_per_step(options):
    assert reads_per_step(Table, PROMPT, **options) == 1


# On the accelerator route the fast path runs its fixed-shape kernels (on CPU eager, a few data-dependent
# checks of CPU memory pick the candidate route instead; see the next test).
@pytest.mark.parametrize("options, expected", [
    (dict(), 1),
    (dict(eos_token_id=EOS), 1),
    (dict(eos_token_id=EOS, check_every=4), 0.25),
    (dict(**FAST, top_k=50), 1),  # the validity flags: read with the length limit's last step too
    (dict(**FAST, top_k=50, eos_token_id=EOS), 1),
    (dict(**FAST, top_k=0, top_p=0.9, eos_token_id=EOS), 1),
    (dict(**FAST, top_k=0, min_p=0.1, eos_token_id=EOS), 1),
    (dict(**FAST, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.2, eos_token_id=EOS), 1),
    (dict(**FAST, top_k=50, eos_token_id=EOS, check_every=4), 0.25),
    (dict(**FAST, top_k=0, top_p=0.9, eos_token_id=EOS, check_every=4), 0.25),
    (dict(**FAST, top_k=0, min_p=0.1, eos_token_id=EOS, check_every=4), 0.25),
    (dict(do_sample=True, top_k=5, eos_token_id=EOS), 2),  # exact: torch.multinomial's own check, then ours
    (dict(do_sample=True, top_k=5, eos_token_id=EOS, check_every=4), 1.25),
], ids=["greedy", "greedy+eos", "greedy+check_every", "top_k", "top_k+eos", "top_p+eos", "min_p+eos",
        "all+eos", "top_k+check_every", "top_p+check_every", "min_p+check_every", "exact", "exact+check_every"])
def test_host_reads_per_step_on_the_accelerator_route(options, expected):
    assert reads_per_step(Wide, PROMPT, **options) == expected


@pytest.mark.parametrize("processors", [
    [TemperatureLogitsWarper(0.7), TopKLogitsWarper(50)],
    [TemperatureLogitsWarper(0.7), TopPLogitsWarper(0.9)],
    [TemperatureLogitsWarper(0.7), MinPLogitsWarper(0.1)],
    [TopKLogitsWarper(50), TopPLogitsWarper(0.9), MinPLogitsWarper(0.05)],
], ids=["top_k", "top_p", "min_p", "all"])
def test_the_fast_step_reads_no_value_off_the_cpu(processors):
    """The candidate route's checks read CPU memory only: on any other device the fast step runs
    its fixed-shape kernels. The meta device has shapes and no values (a read raises), so the step
    running through there reads nothing; on CPU `accelerator_route()` forces the same kernels."""
    meta = fast_draw(None, torch.empty(3, 4096, device="meta"), LogitsProcessorList(processors))
    assert meta.tokens.shape == meta.valid.shape == (3,) and meta.tokens.device.type == "meta"
    scores = torch.randn(3, 4096, generator=torch.Generator().manual_seed(0))
    with HostReads() as reads, accelerator_route():
        fast_draw(None, scores, LogitsProcessorList(processors))
    assert reads.count == 0


def test_greedy_reads_the_logits_through_numpy_on_cpu_only():
    """On CPU eager, greedy's argmax is numpy's (one read of CPU memory, no sync); elsewhere torch's."""
    rows = torch.randn(3, 4096, generator=torch.Generator().manual_seed(0))
    rows[1, 5] = rows[1, 9] = float("nan")  # argmax gives the first NaN, as torch's
    rows[2, 7] = rows[2, 3] = 9.0  # ties: the first
    with HostReads() as cpu:
        tokens, best = greedy_choice(rows)
    with HostReads() as accelerator, accelerator_route():
        route_tokens, route_best = greedy_choice(rows)
    meta_tokens, meta_best = greedy_choice(torch.empty(3, 4096, device="meta"))  # a read would raise
    assert dict(cpu.ops) == {"numpy": 1} and accelerator.count == 0
    expected_best, expected = rows.max(dim=-1)
    assert tokens.tolist() == route_tokens.tolist() == expected.tolist() and tokens[1:].tolist() == [5, 3]
    assert tokens.dtype == route_tokens.dtype == torch.long
    assert torch.equal(best.nan_to_num(), expected_best.nan_to_num()) and best[1].isnan()
    assert torch.equal(route_best.nan_to_num(), expected_best.nan_to_num())
    assert meta_tokens.shape == meta_best.shape == (3,) and meta_tokens.device.type == "meta"


def test_cpu_greedy_loop_reads_cpu_memory_only():
    """The CPU route of the greedy loop: numpy's argmax (CPU memory) besides the one read per step."""
    counts = []
    for new in (6, 14):
        with HostReads() as reads:
            generate(Wide(), PROMPT, max_new_tokens=new, min_new_tokens=new, eos_token_id=EOS)
        counts.append(reads.ops)
    per_step = {op: (counts[1][op] - counts[0][op]) / 8 for op in counts[1]}
    assert {op: count for op, count in per_step.items() if count} == {"numpy": 1, "tolist": 1}


def test_exact_sampling_reads_only_in_torch_multinomial():
    per_step = reads_per_step(Table, PROMPT, do_sample=True, top_k=5, eos_token_id=EOS)
    assert per_step == 2  # multinomial's own check + the finished-rows read


def test_check_every_reads_less():
    assert reads_per_step(Table, PROMPT, eos_token_id=EOS, check_every=4) == 0.25


def test_the_length_limit_needs_no_read():
    """Without eos or other criteria only the length ends the loop; in sampling nothing is read."""
    with HostReads() as short, accelerator_route():
        generate(Table(), PROMPT, max_new_tokens=3, do_sample=True, temperature=0.7, top_k=0, fast=True)
    with HostReads() as long, accelerator_route():
        generate(Table(), PROMPT, max_new_tokens=30, do_sample=True, temperature=0.7, top_k=0, fast=True)
    assert long.count - short.count <= 27 * 1 and short.ops.get("tolist", 0) <= 4


# ---- check_every: same tokens, same scores, fewer reads ----

STAGGERED = torch.tensor([[0, 3], [0, 6], [0, 8], [0, 1]])  # finish after 6, 3, 1 and 8 steps


@pytest.mark.parametrize("check_every", [1, 2, 3, 5, 64])
def test_check_every_keeps_the_tokens(check_every):
    reference = generate(Successor(), STAGGERED, max_new_tokens=20, eos_token_id=EOS, pad_token_id=0)
    model = Successor()
    out = generate(model, STAGGERED, max_new_tokens=20, eos_token_id=EOS, pad_token_id=0, check_every=check_every)
    assert torch.equal(out, reference)
    assert out.shape == (4, 2 + 8)
    assert 8 <= model.calls <= 8 + check_every - 1


@pytest.mark.parametrize("check_every", [2, 3, 7])
@pytest.mark.parametrize("do_sample", [False, True])
def test_check_every_keeps_tokens_scores_and_logits(check_every, do_sample):
    prompt = torch.randint(0, V, (5, 4), generator=torch.Generator().manual_seed(3))
    options = dict(max_new_tokens=25, eos_token_id=[EOS, 11], pad_token_id=0, do_sample=do_sample,
                   return_dict_in_generate=True, output_scores=True, output_logits=True)
    if do_sample:
        options.update(top_k=8, temperature=0.9)
    torch.manual_seed(5)
    reference = generate(Table(seed=2), prompt, **options)
    torch.manual_seed(5)
    out = generate(Table(seed=2), prompt, check_every=check_every, **options)
    assert torch.equal(out.sequences, reference.sequences)
    assert out.sequences.is_contiguous()
    assert len(out.scores) == len(reference.scores) == out.sequences.shape[1] - 4
    for ours, theirs in zip(out.scores + out.logits, reference.scores + reference.logits):
        assert torch.equal(ours, theirs)


def test_check_every_with_a_streamer_checks_every_step():
    tokenizer = char_tokenizer()
    streamer = TextStreamer(tokenizer)
    seen = []
    streamer.on_finalized_text = lambda text, stream_end=False: seen.append(text)
    model = Successor()
    out = generate(model, torch.tensor([[0, 5]]), max_new_tokens=20, eos_token_id=EOS, pad_token_id=0,
                   check_every=8, streamer=streamer)
    assert out.tolist() == [[0, 5, 6, 7, 8, 9]] and model.calls == 4


@pytest.mark.parametrize("value, error, message", [
    (0, ValueError, "`check_every` must be >= 1 (1 checks after every token, as HF), got 0."),
    (True, TypeError, "`check_every` must be an int >= 1 (steps between checks for finished rows), got bool True."),
    ("2", TypeError, "`check_every` must be an int >= 1 (steps between checks for finished rows), got str '2'."),
])
def test_check_every_is_validated(value, error, message):
    model = Table()
    with pytest.raises(error, match=re.escape(message)):
        generate(model, PROMPT, max_new_tokens=3, check_every=value)
    assert model.calls == 0


# ---- deferred validity checks still name the step and the row ----

def _nan_at(step, row):
    calls = []

    def model(idx):
        calls.append(1)
        logits = Table().table[idx]
        if len(calls) == step + 1:
            logits[row, -1, 3] = float("nan")
        return logits
    return model


@pytest.mark.parametrize("options", [dict(), dict(do_sample=True, top_k=4), dict(repetition_penalty=1.2)],
                         ids=["greedy", "sampling", "processors"])
def test_nan_names_step_and_row(options):
    with pytest.raises(ValueError, match=re.escape(
        "generate(): at step 2: `logits` contain NaN in row 1 (1 of 2 rows have NaN); check the model's forward pass"
    )):
        generate(_nan_at(2, 1), PROMPT, max_new_tokens=5, **options)


def test_nan_with_check_every_names_step_and_row():
    with pytest.raises(ValueError, match=re.escape(
        "generate(): at step 2: row 1 has nothing left to choose (1 of 2 rows): its scores after the logits "
        "processors [] are NaN."
    )):
        generate(_nan_at(2, 1), PROMPT, max_new_tokens=8, check_every=4)


def test_nan_in_fast_mode_names_step_and_row():
    with pytest.raises(ValueError, match=re.escape("generate(): at step 1: `logits` contain NaN in row 0")):
        generate(_nan_at(1, 0), PROMPT, max_new_tokens=5, do_sample=True, temperature=0.7, fast=True)


class RemoveAll(LogitsProcessor):
    def __call__(self, input_ids, scores):
        return torch.full_like(scores, float("-inf")) if input_ids.shape[1] == 5 else scores


def test_processors_removing_every_token_name_step_and_row():
    with pytest.raises(ValueError, match=re.escape(
        "generate(): at step 2: the logits processors ['RemoveAll'] removed every token of row 0"
    )):
        generate(Table(), PROMPT, max_new_tokens=5, processors=[RemoveAll()])


def test_a_plus_inf_logit_is_a_valid_greedy_choice():
    def model(idx):
        logits = Table().table[idx].clone()
        logits[:, -1, 7] = float("inf")
        return logits
    assert generate(model, PROMPT, max_new_tokens=2)[:, -2:].tolist() == [[7, 7], [7, 7]]


# ---- synced_gpus ----

def test_synced_gpus_is_validated():
    with pytest.raises(TypeError, match=re.escape("`synced_gpus` must be True, False or None (HF's default), got 'yes'.")):
        generate(Table(), PROMPT, max_new_tokens=2, synced_gpus="yes")
    with pytest.raises(ValueError, match=re.escape("`synced_gpus=True` keeps the ranks of torch.distributed in "
                                                   "lockstep, but no process group is initialised")):
        generate(Table(), PROMPT, max_new_tokens=2, synced_gpus=True)


def test_synced_gpus_default_is_off_without_a_process_group():
    model = Successor()
    out = generate(model, STAGGERED, max_new_tokens=20, eos_token_id=EOS, pad_token_id=0, synced_gpus=None)
    assert out.shape == (4, 10) and model.calls == 8


class Sharded(torch.nn.Module):
    """`Successor` marked as HF marks a module managed by FSDP (`_is_fsdp_managed_module`)."""

    _is_fsdp_managed_module = True

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, idx):
        self.calls += 1
        return torch.nn.functional.one_hot((idx + 1) % V, V).float() * 4.0


class Cached(torch.nn.Module):
    """`ReturnsCache` form of `Successor`: the cache is the list of fed tokens."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, idx, cache):
        self.calls += 1
        seen = idx if cache is None else torch.cat([cache, idx], dim=1)
        return torch.nn.functional.one_hot((idx + 1) % V, V).float() * 4.0, seen


class Positions(torch.nn.Module):
    """`InputPos` form of `Successor`, with a fixed-size cache that refuses positions past its end."""

    def __init__(self, size):
        super().__init__()
        self.cache = torch.zeros(4, size, dtype=torch.long)
        self.calls = 0

    def forward(self, idx, input_pos):
        self.calls += 1
        self.cache[: idx.shape[0], input_pos] = idx
        return torch.nn.functional.one_hot((idx + 1) % V, V).float() * 4.0


# Each rank's prompts: rank 0 finishes after 2 steps, rank 1 after 6 (its second row after 3).
RANK_PROMPTS = {0: [[2, 7]], 1: [[2, 3], [2, 6]]}


def _run_rank(rank: int, port: int) -> tuple:
    torch.set_num_threads(1)
    prompt = torch.tensor(RANK_PROMPTS[rank])
    options = dict(max_new_tokens=12, eos_token_id=EOS, pad_token_id=0)
    forms = {"plain": Successor, "cache": lambda: ReturnsCache(Cached()), "input_pos": lambda: InputPos(Positions(16))}
    alone = {}
    for name, make in forms.items():
        model = make()
        alone[name] = (generate(model, prompt, **options).tolist(), _calls(model))
    # `run_two_ranks` destroys the group once this rank's values are sent
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    synced = {}
    for name, make in forms.items():
        model = make()
        synced[name] = (generate(model, prompt, synced_gpus=True, **options).tolist(), _calls(model))
    model = Successor()
    default = (generate(model, prompt, **options).tolist(), model.calls)  # HF's rule: a plain model is not sharded
    model = Sharded()
    sharded = (generate(model, prompt, **options).tolist(), model.calls)  # HF's rule: FSDP-managed, 2 ranks: on
    check_every = Successor()
    checked = (generate(check_every, prompt, synced_gpus=True, check_every=4, **options).tolist(),
               check_every.calls)
    return alone, synced, default, checked, sharded


def _calls(model) -> int:
    return getattr(model, "model", model).calls


def test_synced_gpus_two_gloo_ranks():
    got = run_two_ranks(_run_rank)
    for rank in (0, 1):
        alone, synced, default, checked, sharded = got[rank]
        assert sharded[0] == alone["plain"][0] and sharded[1] == 6  # lockstep by default, as HF
        for name in alone:
            assert synced[name][0] == alone[name][0], (rank, name)  # each returns what it returns alone
        assert default == alone["plain"]  # synced_gpus=None: HF's rule, off for a model that is not sharded
        assert checked[0] == alone["plain"][0]
    assert got[0][0]["plain"][1] == 2 and got[1][0]["plain"][1] == 6  # alone: different numbers of calls
    for name in got[0][0]:
        assert got[0][1][name][1] == got[1][1][name][1] == 6, name  # in lockstep: the same number of calls
    assert got[0][3][1] == got[1][3][1] >= 6


@pytest.mark.parametrize("module", [hfbridge._generate.finished, hfbridge._generate.lockstep, hfbridge._step.run.cpu_shortcuts],
                         ids=lambda module: module.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
