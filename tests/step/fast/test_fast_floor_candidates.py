"""Top-p candidates above a floor under the last step's cut: HF's set, or the best-k route."""

import pytest
import torch
from _zipf import zipf
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge._step.fast.candidates import top_p_candidates
from hfbridge._step.fast.fast_path import fast_draw
from hfbridge._step.fast.top_p.floor_candidates import candidates_above, next_floor

NEG_INF = float("-inf")


def test_candidates_above_a_floor_come_best_first_and_pad_below_the_floor():
    scores = torch.tensor([[1.0, 4.0, 4.0, -2.0, 0.5, 3.0], [0.0, 2.0, NEG_INF, 7.0, 1.0, -1.0]])
    cand, ids = candidates_above(scores, torch.tensor([0.5, 1.5]))
    assert cand.tolist() == [[4.0, 4.0, 3.0, 1.0, 0.5], [7.0, 2.0, NEG_INF, NEG_INF, NEG_INF]]
    assert ids[0].tolist() == [1, 2, 5, 0, 4]  # equal scores by ascending id
    assert ids[1, :2].tolist() == [3, 1] and bool((scores[1, ids[1, 2:]] < 1.5).all())  # padding below the floor
    assert candidates_above(scores, torch.tensor([9.0, 0.0])) is None  # nothing above a floor
    assert candidates_above(scores, torch.tensor([NEG_INF, 0.0])) is None  # every token: select the best k
    assert candidates_above(scores, torch.tensor([float("nan"), 0.0])) is None
    assert candidates_above(torch.randn(1, 5000), torch.tensor([-10.0])) is None  # more than 2048
    assert torch.equal(next_floor(cand, torch.tensor([[3], [1]])), torch.tensor([3.0, 7.0]) - torch.tensor(4.0).log())


@pytest.mark.parametrize(("first", "then"), [(0.7, 0.8), (0.8, 0.7), (0.6, 0.8), (0.8, 0.5), (0.8, 1.5)])
def test_the_floor_from_the_last_step_finds_hfs_set(first, then):
    # A floor from a step at another temperature: where its candidates hold the cut, the kept set
    # is HF's; where they do not, the best-k route answers, with the same set.
    x = zipf(6, 32000, seed=5)
    memo = {}
    scores = x / first
    assert top_p_candidates(scores, torch.softmax(scores, dim=-1), 0.9, 1, memo).proved  # best k
    assert memo["floor"].shape == (6,)
    scores = x / then + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(6))
    tried = top_p_candidates(scores, torch.softmax(scores, dim=-1), 0.9, 1, memo)
    ref = LogitsProcessorList([hf.TopPLogitsWarper(0.9)])(None, scores.clone()) > NEG_INF
    if then > 1:  # thousands kept: no candidates hold the cut, and the floor is dropped
        assert not tried.proved and "floor" not in memo
        return
    assert tried.proved
    for row in range(6):
        kept = tried.ids[row][tried.keep()[row]]
        assert sorted(kept.tolist()) == ref[row].nonzero().squeeze(1).tolist()


def test_padded_rows_write_hfs_scores():
    # Rows keep different counts, so the floor's candidates are padded; the scores the fast path
    # writes (an error message, a later processor) are HF's all the same.
    x = torch.cat([zipf(3, 20000, seed=8), zipf(3, 20000, seed=9, exponent=1.6)])
    processors = LogitsProcessorList([hf.TemperatureLogitsWarper(0.8), hf.TopPLogitsWarper(0.9)])
    memo = {}
    fast_draw(None, x.clone(), processors, torch.Generator().manual_seed(0), memo=memo)
    noisy = x + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    out = fast_draw(None, noisy.clone(), processors, torch.Generator().manual_seed(0), memo=memo)
    assert torch.equal(out.final_scores(), processors(None, noisy.clone()))
    assert bool(out.valid.all())
