"""One top-p (and temperature) per row in one fast draw: every top-p kernel keeps, row by row, exactly
the tokens HF's `TopPLogitsWarper` of that row's top-p keeps after that row's temperature."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge import Sampler
from hfbridge._step.fast.candidates import top_p_count
from hfbridge._step.fast.fast_path import fast_draw, fast_scores
from hfbridge._step.fast.top_p.compiled import fixed_top_p, top_p_keep
from hfbridge._step.fast.top_p.device_sort import sorted_top_p_keep
from hfbridge._step.fast.top_p.floor_candidates import _descending, candidates_above
from hfbridge._step.fast.top_p.mask import float32, removal_cut, rounds_at_most, top_p_mask
from hfbridge._step.fast.top_p.sorted_mask import top_p_mask_sorted
from hfbridge._step.plan.per_row import tensor_temperature, tensor_top_p
from hfbridge._step.run.cpu_shortcuts import accelerator_route

NEG_INF = float("-inf")
KINDS = ("flat", "zipf", "ties", "neginf")


def _row(kind: str, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "zipf":
        ranks = torch.arange(1, vocab + 1, dtype=torch.float32)
        return (-1.1 * ranks.log())[torch.randperm(vocab, generator=g)] + 0.1 * torch.randn(vocab, generator=g)
    x = torch.randn(vocab, generator=g) * 2
    if kind == "ties":  # many exactly equal scores, some straddling the cut
        return (x * 2).round() / 2
    if kind == "neginf":
        return x.masked_fill(torch.rand(vocab, generator=g) < 0.5, NEG_INF)
    return x


def _hf_keep(row: torch.Tensor, temperature: float, top_p: float, at_least: int = 1) -> torch.Tensor:
    """`(vocab,)` bool: the tokens HF keeps in this row alone (a NaN filter value tells removed from -inf)."""
    scores = hf.TemperatureLogitsWarper(temperature)(None, row[None].clone())
    out = hf.TopPLogitsWarper(top_p, filter_value=float("nan"), min_tokens_to_keep=at_least)(None, scores)
    return ~torch.isnan(out[0])


def _assert_hf(keep: torch.Tensor, x: torch.Tensor, temps: list, tops: list, kinds: list, at_least: int = 1,
               what: str = "") -> None:
    """Each row's kept set is HF's, but for the two places where HF's own answer rests on details it does
    not specify (docs/fast_path.md): exactly equal scores straddling the cut (HF's sort leaves their order
    open: the same number of them is kept), and a running sum within float rounding of `1 - top_p` (HF
    sums a softmax of the sorted scores: the token at the cut may differ)."""
    for row, (t, p, kind) in enumerate(zip(temps, tops, kinds)):
        expected = _hf_keep(x[row], t, p, at_least)
        if torch.equal(keep[row], expected):
            continue
        differ = keep[row] ^ expected
        scores = x[row] / t
        assert bool((scores[differ] == scores[differ][0]).all()), (what, row, kind)  # one tie group at the cut
        if kind == "ties" and int(keep[row].sum()) == int(expected.sum()):
            continue
        probs = torch.softmax(scores[None], dim=-1)[0].double()
        at = scores == scores[differ][0]  # the group at the cut
        below, each, size = float(probs[scores < scores[differ][0]].sum()), float(probs[at][0]), int(at.sum())
        steps = min(max(round((1 - p - below) / each), 0), size)  # HF's running sum nearest to 1 - top_p
        assert abs(below + steps * each - (1 - p)) < 1e-6, (what, row, kind)


def _batch(kinds: list, vocab: int, seed: int) -> torch.Tensor:
    return torch.stack([_row(kind, vocab, seed + i) for i, kind in enumerate(kinds)])


rows = st.lists(st.tuples(st.sampled_from(KINDS),
                          st.sampled_from([0.3, 0.7, 0.8, 1.0, 1.6]),  # temperature
                          st.one_of(st.floats(0.01, 1.0), st.sampled_from([1.0, 0.9, 0.5, 1e-6]))),  # top-p
                min_size=1, max_size=5)


@settings(max_examples=30, deadline=None)
@given(spec=rows, vocab=st.sampled_from([40, 3000, 40000]), seed=st.integers(0, 10_000),
       at_least=st.sampled_from([1, 1, 3]))
def test_every_route_keeps_hf_set_per_row(spec, vocab, seed, at_least):
    kinds, temps, tops = (list(v) for v in zip(*spec))
    x = _batch(kinds, vocab, seed)
    processors = LogitsProcessorList([tensor_temperature(torch.tensor(temps)[:, None]),
                                      tensor_top_p(tops, min_tokens_to_keep=at_least)])
    for candidates in (True, False):  # the CPU routes (candidates, draw, NumPy sort), the device sort
        got = fast_scores(None, x.clone(), processors, candidates=candidates)
        _assert_hf(got > NEG_INF, x, temps, tops, kinds, at_least, f"candidates={candidates}")
        for row, (t, p) in enumerate(zip(temps, tops)):  # each row as it is alone, with HF's own warpers
            alone = fast_scores(None, x[row:row + 1].clone(), [hf.TemperatureLogitsWarper(t),
                                                               hf.TopPLogitsWarper(p, min_tokens_to_keep=at_least)],
                                candidates=candidates)
            assert torch.equal(got[row:row + 1], alone), (candidates, row)
    with accelerator_route():
        keep = fast_scores(None, x.clone(), processors) > NEG_INF
    _assert_hf(keep, x, temps, tops, kinds, at_least, "accelerator route")
    scores = x / torch.tensor(temps)[:, None]
    probs = torch.softmax(scores, dim=-1)
    top_p = torch.tensor(tops, dtype=torch.float64)[:, None]
    live = [row for row in range(len(kinds)) if bool((x[row] > NEG_INF).any())]
    kernels = {
        "radix": top_p_mask(probs, top_p, at_least, scores=scores),
        "radix, branch": top_p_mask(probs, top_p, at_least, scores=scores, branch=True),
        "numpy sort": top_p_mask_sorted(probs, top_p, at_least, scores=scores),
        "device sort": sorted_top_p_keep(scores, top_p, at_least),
        "fixed shapes": top_p_keep(scores, probs, top_p, at_least, route="both"),
        "fixed, applied": fixed_top_p(scores, top_p, at_least).apply(NEG_INF, route="both") > NEG_INF,
    }
    alone = {  # each kernel on each row alone, with that row's top-p as a float: the same bits
        "radix": lambda r: top_p_mask(probs[r], tops[r.start], at_least, scores=scores[r]),
        "numpy sort": lambda r: top_p_mask_sorted(probs[r], tops[r.start], at_least, scores=scores[r]),
        "device sort": lambda r: sorted_top_p_keep(scores[r], tops[r.start], at_least),
        "fixed shapes": lambda r: top_p_keep(scores[r], probs[r], tops[r.start], at_least, route="both"),
    }
    for name, kernel in alone.items():
        assert torch.equal(kernels[name], torch.cat([kernel(slice(r, r + 1)) for r in range(len(kinds))])), name
    for name, keep in kernels.items():
        keep = keep & (x > NEG_INF)
        _assert_hf(keep[live], x[live], [temps[r] for r in live], [tops[r] for r in live], [kinds[r] for r in live],
                   at_least, name)


@settings(max_examples=20, deadline=None)
@given(spec=rows, seed=st.integers(0, 10_000))
def test_draws_stay_in_hf_set_per_row(spec, seed):
    kinds, temps, tops = (list(v) for v in zip(*spec))
    x = _batch(kinds, 40000, seed)
    processors = [tensor_temperature(torch.tensor(temps)[:, None]), tensor_top_p(tops)]
    keeps = torch.stack([_hf_keep(x[row], t, p) for row, (t, p) in enumerate(zip(temps, tops))])
    memo: dict = {}
    for draw in range(4):  # the memo's floors and counts carry from one draw to the next
        drawn = fast_draw(None, x, processors, torch.Generator().manual_seed(draw), memo=memo, read_only=True)
        for row, token in enumerate(drawn.tokens.tolist()):
            # HF's set, or (a tie group straddling the cut, whose order HF leaves unspecified) tied with its last
            assert keeps[row, token] or (kinds[row] == "ties" and x[row, token] == x[row][keeps[row]].min()), row
        assert bool(drawn.valid.all())


def test_a_top_p_per_row_is_hf_cut_at_the_float32_bounds():
    # 1 - top_p straddling float32 rounding: the cut per row is each value's own, as the scalar one
    tops = [0.9, 0.7, 1.0, 1e-6, 0.5, float(np.nextafter(np.float32(0.9), 1)), 0.1 + 2**-40, 0.999999]
    cut, inclusive = removal_cut(torch.tensor(tops, dtype=torch.float64)[:, None])
    assert [(c, i) for c, i in zip(cut[:, 0].tolist(), inclusive[:, 0].tolist())] == \
        [rounds_at_most(float32(1.0 - p)) for p in tops]
    probs = torch.tensor([[0.5, 0.3, 0.2]] * len(tops))
    counts = top_p_count(probs, torch.zeros(len(tops), 1, dtype=torch.float64), torch.tensor(tops).double()[:, None], 1)
    assert counts[:, 0].tolist() == [int(top_p_count(probs[:1], torch.zeros(1, 1, dtype=torch.float64), p, 1))
                                     for p in tops]


def test_floor_candidates_keep_the_best_of_a_crowded_row():
    x = torch.stack([_row("zipf", 40000, 1), _row("flat", 40000, 2) * 0.01, _row("zipf", 40000, 3)])
    floor = torch.tensor([-6.0, -0.02, -6.0])  # the flat row has most of its tokens above its floor
    found = candidates_above(x, floor)
    assert found is not None
    cand, ids = found
    assert cand.shape[1] == 2048
    best = torch.topk(x[1], 2048)
    assert torch.equal(cand[1], best.values) and set(ids[1].tolist()) == set(best.indices.tolist())
    for row in (0, 2):
        real = cand[row] > NEG_INF
        assert set(ids[row][real].tolist()) == set((x[row] >= floor[row]).nonzero()[:, 0].tolist())
    assert candidates_above(x[1:2], floor[1:2]) is None  # most rows crowded: the caller selects the best k


def test_descending_orders_equal_scores_by_id_and_zeros_as_equal():
    values = np.array([0.0, -0.0, 2.5, 2.5, -1.0, np.inf, -np.inf, 0.0], np.float32)
    ids = np.array([9, 3, 7, 4, 1, 0, 8, 2])
    expected = sorted(range(8), key=lambda i: (-float(values[i]), ids[i]))
    assert _descending(values, ids).tolist() == [ids[i] for i in expected]


@pytest.mark.parametrize("values", [list, np.array, lambda v: [np.float32(x) for x in v]], ids=["list", "array", "np"])
def test_sampler_with_a_greedy_row_and_distinct_top_p_is_one_draw(values):
    temps, tops = values([0.7, 0.0, 1.3, 0.9, 0.7]), values([0.9, 0.5, 0.99, 0.6, 0.95])
    x = _batch(["zipf", "flat", "zipf", "ties", "flat"], 3000, 7)
    sampler = Sampler(temperature=temps, top_p=tops, top_k=0, fast=True)
    temps, tops = [float(t) for t in temps], [float(p) for p in tops]  # as HF's warpers of each row hold them
    groups = sampler._rows.plan.fast_groups(torch.device("cpu"))
    assert sorted(rows for rows, _, _, samples in groups if samples) == [[0, 2, 3, 4]]  # one draw, four top-p
    ids = torch.zeros(5, 0, dtype=torch.long)
    for seed in range(3):
        torch.manual_seed(seed)
        tokens = sampler(x, ids)
        assert tokens[1] == x[1].argmax()
        for row in (0, 2, 3, 4):
            assert _hf_keep(x[row], temps[row], tops[row])[tokens[row]], row


def test_a_row_without_top_p_never_shares_a_draw_with_rows_that_have_it():
    # top_p 1.0 builds no warper in HF; a warper at 1.0 would still remove tokens of probability 0
    sampler = Sampler(temperature=[0.7, 0.8, 0.9], top_p=[1.0, 0.9, 0.8], top_k=0, fast=True)
    groups = sorted(rows for rows, _, _, _ in sampler._rows.plan.fast_groups(torch.device("cpu")))
    assert groups == [[0], [1, 2]]
    x = torch.tensor([[0.0, -200.0, 1.0], [0.0, -200.0, 1.0], [0.0, -200.0, 1.0]])
    exact = Sampler(temperature=[0.7, 0.8, 0.9], top_p=[1.0, 0.9, 0.8], top_k=0).process(torch.zeros(3, 0, dtype=torch.long),
                                                                                   x.clone())
    sampler.next_tokens(torch.zeros(3, 0, dtype=torch.long), x, check=False)
    assert torch.equal(sampler._last_fast[0].final_scores(), exact)


def test_one_row_batch_with_a_per_row_top_p():
    x = _row("zipf", 40000, 5)[None]
    tokens = {int(Sampler(temperature=[0.8], top_p=[0.9], top_k=0, fast=True)(x, torch.zeros(1, 0, dtype=torch.long))[0])
              for _ in range(5)}
    assert all(_hf_keep(x[0], 0.8, 0.9)[t] for t in tokens)
