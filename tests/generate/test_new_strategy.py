"""A new strategy is one runner plus one row of the strategy table (`hfbridge/_generate/strategies.py`'s
`STRATEGIES`), and then runs through `generate` with the row's checks, the table's refusals (per-row values,
`check_every`, banned strings, `thinking_options`) and the call prepared as for every strategy. The strategy here
is an example written for this test: group beam search with one beam per group ("diverse greedy", the mode HF
names `group_beam_search`, which hfbridge refuses otherwise). This module is its "new module", `ROW` its one row,
and nothing else in hfbridge changes (a real one adds a line to docs/generate.md's table, which
`tests/test_public_api.py` checks)."""

import inspect

import pytest
import torch
from transformers import GenerationMixin

from hfbridge import generate
from hfbridge._generate.loop import forward_and_update
from hfbridge._generate.modes import Strategy
from hfbridge._generate.strategies import STRATEGIES
from hfbridge._hf.stand_in import special_token
from hfbridge._step.run.sampler import extract_logits

# Before transformers 5, group beam search is transformers' own mode: its config checks `diversity_penalty` against
# `num_beam_groups`, and its processor chain holds `HammingDiversityLogitsProcessor`, which takes the loop's
# `current_tokens` and `beam_group_idx`; the example's mode name is taken there.
pytestmark = pytest.mark.skipif(
    "HammingDiversityLogitsProcessor" in inspect.getsource(GenerationMixin._get_logits_processor),
    reason="this transformers runs group beam search itself (its chain builds HammingDiversityLogitsProcessor)")


def check_one_beam_per_group(adapter, config, options, **ignored):
    """The row's check, before any model call."""
    if config.num_beam_groups != config.num_beams:
        raise ValueError(f"one beam per group: num_beam_groups={config.num_beam_groups} must equal "
                         f"num_beams={config.num_beams}.")


def run_diverse_greedy(adapter, call, options, loop):
    """Each group takes the argmax of its processed log-probabilities less `diversity_penalty` times the number of
    earlier groups that chose that token at this step (HF's Hamming diversity); finished rows get the pad token."""
    penalty, groups, pad = float(call.config.diversity_penalty), call.expand, special_token(call.config, "pad")
    done = torch.zeros(call.sequences.shape[0], dtype=torch.bool)  # [N]
    step = 0
    while not bool(done.all()):
        call.state["attention_mask"] = call.mask
        outputs, call.state = forward_and_update(adapter, call.sequences, call.state, step, "diverse greedy")
        rows = call.sampler.last_rows(extract_logits(adapter.logits(outputs)))  # [N, V]
        scores = call.sampler.process(call.sequences, rows.float()).log_softmax(-1).view(call.prompts, groups, -1)
        chosen = []
        for group in range(groups):
            counts = torch.zeros_like(scores[:, group])  # [B, V]
            for token in chosen:
                counts.scatter_add_(1, token[:, None], torch.ones_like(counts[:, :1]))
            chosen.append((scores[:, group] - penalty * counts).argmax(-1))
        tokens = torch.stack(chosen, dim=1).reshape(-1)  # [N]
        tokens = tokens if pad is None else torch.where(done, pad, tokens)
        call.sequences = torch.cat([call.sequences, tokens[:, None]], dim=-1)
        call.mask = torch.cat([call.mask, call.mask.new_ones((call.mask.shape[0], 1))], dim=-1)
        done |= call.criteria(call.sequences, None)
        step += 1
    return call.sequences


ROW = Strategy("diverse greedy", run_diverse_greedy, beams=True, check=check_one_beam_per_group)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(STRATEGIES, "group_beam_search", ROW)


TABLE = torch.randn(16, 16, generator=torch.Generator().manual_seed(3))  # a bigram "model"


def model(ids):
    return TABLE[ids]  # [B, T] -> [B, T, V]


def reference(prompt, groups, penalty, new, eos=None):
    """Each group's row by hand: the bigram's log-probabilities, less the penalty per earlier group's token."""
    rows, done = [list(prompt) for _ in range(groups)], [False] * groups
    for _ in range(new):
        chosen = []
        for row in rows:
            scores = TABLE[row[-1]].log_softmax(-1).clone()
            for token in chosen:
                scores[token] -= penalty
            chosen.append(int(scores.argmax()))
        for group, (row, token) in enumerate(zip(rows, chosen)):
            row.append(0 if done[group] else token)
            done[group] = done[group] or token == eos
        if all(done):
            break
    return torch.tensor(rows)


@pytest.mark.parametrize(("groups", "penalty"), [(2, 0.0), (3, 0.5), (3, 100.0)])
def test_it_runs_through_generate(registered, groups, penalty):
    out = generate(model, torch.tensor([[1, 2]]), num_beams=groups, num_beam_groups=groups,
                   diversity_penalty=penalty, max_new_tokens=5)
    assert torch.equal(out, reference([1, 2], groups, penalty, 5))


def test_finished_rows_get_the_pad_token_and_the_call_stops(registered):
    free = reference([1, 2], 3, 100.0, 6)
    eos = int(free[1, 3])  # group 1's second token: it finishes there
    out = generate(model, torch.tensor([[1, 2]]), num_beams=3, num_beam_groups=3, diversity_penalty=100.0,
                   max_new_tokens=6, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(out, reference([1, 2], 3, 100.0, 6, eos=eos))


def test_the_rows_check_and_the_tables_refusals_come_before_any_call(registered):
    calls = []

    def counted(ids):
        calls.append(ids)
        return TABLE[ids]

    prompt, options = torch.tensor([[1, 2]]), dict(num_beam_groups=2, diversity_penalty=0.5, max_new_tokens=3)
    with pytest.raises(ValueError, match="one beam per group: num_beam_groups=2 must equal num_beams=4"):
        generate(counted, prompt, num_beams=4, **options)
    with pytest.raises(ValueError, match=r"`check_every`=2 applies to greedy search and sampling; diverse greedy"):
        generate(counted, prompt, num_beams=2, check_every=2, **options)
    with pytest.raises(ValueError, match="`repetition_penalty` per row works with greedy decoding and sampling, "
                                         "not with diverse greedy"):
        generate(counted, torch.tensor([[1, 2], [3, 4]]), num_beams=2, repetition_penalty=[1.0, 1.2], **options)
    with pytest.raises(ValueError, match="`thinking_options` works with greedy search and sampling, not with diverse"):
        generate(counted, prompt, num_beams=2, thinking_options={"temperature": 0.5}, thinking_start=[3],
                 thinking_end=[4], **options)
    assert calls == []


def test_without_its_row_the_mode_is_refused_again():
    assert STRATEGIES["group_beam_search"] is not ROW
    if STRATEGIES["group_beam_search"].refused is None:
        pytest.skip("hfbridge runs group beam search itself now")
    with pytest.raises(ValueError, match="generate\\(\\) does not support group beam search"):
        generate(model, torch.tensor([[1, 2]]), num_beams=2, num_beam_groups=2, diversity_penalty=0.5,
                 max_new_tokens=3)
