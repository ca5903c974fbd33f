"""MirostatV1LogitsWarper against llama.cpp's `llama_sampler_mirostat_apply`, rewritten as a plain
per-row reference (Python floats); a vector worked by hand; per-row values; edge rows (one
candidate, a uniform row, tokens already removed); transformers' own `generate`; rollback; errors."""

from __future__ import annotations

import math
import random

import pytest
import torch
from _host_reads import HostReads
from transformers import LogitsProcessorList

from hfbridge import Recompute, accelerator_route, build_processors, generate, sample_step
from hfbridge.processors import MirostatV1LogitsWarper

from _tiny_models import model_cache, recompute_callable

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

_model = model_cache()
NEG_INF = float("-inf")


def reference_keep(logits, mu, m):
    """llama.cpp's mirostat 1 for one row: (kept token ids, their renormalised probabilities, k)."""
    n_vocab = len(logits)
    candidates = sorted((x, i) for i, x in enumerate(logits) if x != NEG_INF)[::-1]
    best = candidates[0][0]
    total = sum(math.exp(x - best) for x, _ in candidates)
    p = [math.exp(x - best) / total for x, _ in candidates]
    sum_tb = sum_tt = 0.0
    for i in range(min(m - 1, len(p) - 1)):
        t = math.log((i + 2) / (i + 1))
        sum_tb += t * math.log(p[i] / p[i + 1])
        sum_tt += t * t
    if sum_tt == 0:
        k = 1  # 0 / 0: llama.cpp's int(NaN), kept as one token
    else:
        s_hat = sum_tb / sum_tt
        e = s_hat - 1
        k = max(int(min(((e * 2 ** mu) / (1 - n_vocab ** -e)) ** (1 / s_hat), n_vocab)), 1)
    k = min(k, len(candidates))
    threshold = candidates[k - 1][0]
    kept = [i for x, i in candidates if x >= threshold]  # ties with the k-th stay, as HF's top-k
    kept_total = sum(math.exp(logits[i] - best) for i in kept)
    return sorted(kept), {i: math.exp(logits[i] - best) / kept_total for i in kept}, k


def test_a_vector_by_hand():
    # p = (0.5, 0.25, 0.15, 0.1), mu = 2: s = 1.105, k = ((0.105 * 4) / (1 - 4^-0.105))^(1 / 1.105) = 2.79
    t = [math.log(2), math.log(1.5), math.log(4 / 3)]
    b = [math.log(2), math.log(0.25 / 0.15), math.log(1.5)]
    s = sum(x * y for x, y in zip(t, b)) / sum(x * x for x in t)
    k = ((s - 1) * 4 / (1 - 4 ** -(s - 1))) ** (1 / s)
    assert 2 < k < 3
    warper = MirostatV1LogitsWarper(tau=1.0, eta=0.5)
    scores = torch.tensor([[0.5, 0.25, 0.15, 0.1]]).log()
    assert warper(torch.tensor([[0]]), scores).isfinite().tolist() == [[True, True, False, False]]
    # token 1 chosen: p' = 0.25 / 0.75 = 1/3, surprise log2(3): mu = 2 - 0.5 * (log2(3) - 1)
    warper(torch.tensor([[0, 1]]), scores)
    torch.testing.assert_close(warper.mu, torch.tensor([2 - 0.5 * (math.log2(3) - 1)]))


@pytest.mark.parametrize("seed", range(8))
def test_equals_the_reference_on_random_rows(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    rows, vocab = 3, 40
    taus = [rng.choice([1.0, 3.0, 5.0]) for _ in range(rows)]
    etas = [rng.choice([0.1, 0.5, 1.0]) for _ in range(rows)]
    ms = [rng.choice([1, 2, 5, 100]) for _ in range(rows)]
    warper = MirostatV1LogitsWarper(taus, etas, ms)
    mus = [2 * tau for tau in taus]
    ids = torch.randint(0, vocab, (rows, 2))
    for _ in range(15):
        scores = torch.randn(rows, vocab) * rng.choice([0.5, 2.0, 4.0])
        scores[:, rng.randrange(vocab)] = NEG_INF  # removed before it: not a candidate
        out = warper(ids, scores)
        torch.testing.assert_close(warper.mu, torch.tensor(mus), rtol=1e-4, atol=1e-4)
        chosen = []
        for row in range(rows):
            kept, probs, k = reference_keep(scores[row].tolist(), mus[row], ms[row])
            assert out[row].isfinite().nonzero().flatten().tolist() == kept
            assert warper.k[row].item() == k
            token = kept[rng.randrange(len(kept))]
            chosen.append(token)
            mus[row] -= etas[row] * (-math.log2(probs[token]) - taus[row])
        ids = torch.cat([ids, torch.tensor(chosen)[:, None]], 1)


def test_edge_rows():
    warper = MirostatV1LogitsWarper(tau=3.0)
    # one candidate left (no pair to estimate from): that one; a uniform row (s = 0): k = 0 -> one token,
    # or every token when 2^mu > vocab - 1
    scores = torch.tensor([[NEG_INF, 2.0, NEG_INF, NEG_INF], [1.0, 1.0, 1.0, 1.0]])
    out = warper(torch.tensor([[0], [0]]), scores)
    assert out.isfinite().sum(-1).tolist() == [1, 4]  # mu = 6: 2^6 > 3, k infinite: all (ties kept)
    out = MirostatV1LogitsWarper(tau=0.5)(torch.tensor([[0]]), scores[1:])  # 2^1 < 3: k -> 0 -> 1 token
    assert out.isfinite().sum().item() == 4  # ... tied with the best: HF's top-k keeps ties


def test_rollback_gives_the_state_of_a_run_that_never_saw_the_tokens():
    torch.manual_seed(1)
    scores = [torch.randn(1, 12) * 3 for _ in range(6)]
    tokens = [int(s.argmax()) for s in scores]
    warper = MirostatV1LogitsWarper(2.0, 0.7)
    for n in range(6):
        warper(torch.tensor([[0] + tokens[:n]]), scores[n])
    warper.rollback(torch.tensor([3]))
    warper(torch.tensor([[0] + tokens[:2]]), scores[2])
    fresh = MirostatV1LogitsWarper(2.0, 0.7)
    for n in range(3):
        fresh(torch.tensor([[0] + tokens[:n]]), scores[n])
    assert torch.equal(warper.mu, fresh.mu)


PROMPT = torch.tensor([[5, 9, 13, 2, 7, 21], [0, 0, 3, 4, 11, 7]])
MASK = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])


@pytest.mark.parametrize("model_name", ["gpt2", "llama"])
def test_hf_generate_with_the_class_equals_hfbridge_with_the_options(model_name):
    hf = _model(model_name)
    torch.manual_seed(4)
    warper = MirostatV1LogitsWarper([2.0, 4.0], 0.3, m=[10, 100])
    theirs = hf.generate(PROMPT, attention_mask=MASK, use_cache=False, max_new_tokens=12, do_sample=True, top_k=0,
                         logits_processor=LogitsProcessorList([warper]))
    torch.manual_seed(4)
    ours = generate(Recompute(recompute_callable(hf)), PROMPT, attention_mask=MASK, max_new_tokens=12, top_k=0,
                    mirostat=1, mirostat_tau=[2.0, 4.0], mirostat_eta=0.3, mirostat_m=[10, 100])
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"


def test_option_builds_version_one_last():
    built = build_processors(mirostat=1, top_k=0, temperature=0.8, renormalize_logits=True)
    assert [type(p).__name__ for p in built] == ["TemperatureLogitsWarper", "MirostatV1LogitsWarper",
                                                 "LogitNormalization"]
    warper = built[1]
    assert (warper.tau.values, warper.eta.values, warper.m.values) == ((5.0,), (0.1,), (100,))  # llama.cpp's


def test_no_host_reads():
    warper = MirostatV1LogitsWarper([2.0, 5.0])
    ids = torch.tensor([[1], [2]])
    scores = torch.randn(2, 64)
    before = scores.clone()
    with accelerator_route(), HostReads() as reads:  # what an accelerator runs (on CPU a host read is free)
        for token in range(4):
            warper(ids, scores)
            ids = torch.cat([ids, torch.full((2, 1), token)], 1)
    assert reads.count == 0, reads.ops
    assert torch.equal(scores, before)


@pytest.mark.parametrize("options,error,message", [
    (dict(mirostat=3), ValueError, r"^`mirostat` must be 0 \(off\), 1 \(mirostat 1.0\) or 2 \(mirostat 2.0\), got 3.$"),
    (dict(mirostat=1.0), TypeError, r"^`mirostat` must be an int"),
    (dict(mirostat=1, mirostat_m=0), ValueError, r"^`mirostat_m` must be >= 1, got 0.$"),
    (dict(mirostat=1, mirostat_m=2.5), TypeError, r"^`mirostat_m` must be an int, got float 2.5.$"),
    (dict(mirostat=1, mirostat_tau=0.0), ValueError, r"^`mirostat_tau` must be > 0.0, got 0.0.$"),
    (dict(mirostat=1, mirostat_m=[5, 6, 7]), ValueError,
     r"^`mirostat_m` has 3 values, one per row, but the step has 2 rows; pass one value per row, or a single number "
     r"for every row.$"),
])
def test_option_errors_name_the_option(options, error, message):
    with pytest.raises(error, match=message):
        sample_step(torch.zeros(2, 8), torch.tensor([[1], [2]]), top_k=0, **options)


def test_a_step_without_context_and_one_token_vocabularies():
    scores = torch.randn(2, 9)
    out = MirostatV1LogitsWarper(2.0)(torch.zeros(2, 0, dtype=torch.long), scores)
    for row in range(2):
        kept, _, _ = reference_keep(scores[row].tolist(), 4.0, 100)
        assert out[row].isfinite().nonzero().flatten().tolist() == kept
    assert sample_step(scores, mirostat=1, top_k=0).shape == (2,)
    assert MirostatV1LogitsWarper()(torch.tensor([[0]]), torch.zeros(1, 1)).tolist() == [[0.0]]


@pytest.mark.parametrize("seed", range(4))
def test_kth_best_by_radix_select_equals_a_sort(seed):
    from hfbridge.processors.mirostat_v1 import _at_least_kth

    torch.manual_seed(seed)
    rows, vocab = 6, 300
    scores = torch.randn(rows, vocab) * 10
    scores[0, :50] = 0.0
    scores[0, 50:60] = -0.0  # equal to +0.0
    scores[1, ::3] = NEG_INF
    scores[2] = scores[2].round()  # many ties
    scores[3] = -scores[3].abs() - 1e30
    k = torch.tensor([55, 90, 150, 1, 300, 7])
    threshold = scores.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
    assert torch.equal(_at_least_kth(scores, k), scores >= threshold)
    assert torch.equal(_at_least_kth(scores.double(), k), scores.double() >= threshold.double())


@pytest.mark.parametrize("tau", [0.5, 3.0, 5.0, 9.0])
def test_the_host_paths_listed_cut_equals_the_radix_select(tau):
    # rows of Zipf-like scores (k from 1 to thousands), ties around the k-th, a row with -inf entries,
    # a row whose k passes 4,096: the host path where it applies, the general one elsewhere, same answers
    torch.manual_seed(int(tau * 10))
    rows, vocab = 5, 8192
    rank = torch.arange(1, vocab + 1, dtype=torch.float32)
    host, general = MirostatV1LogitsWarper(tau, 0.3), MirostatV1LogitsWarper(tau, 0.3)
    ids = torch.randint(0, vocab, (rows, 3))
    for step in range(6):
        scores = (-1.1 * rank.log())[torch.argsort(torch.rand(rows, vocab), dim=-1)] * (0.5 + step / 4)
        scores[1] = scores[1].round()  # ties
        scores[2, ::5] = NEG_INF
        scores[3] = torch.randn(vocab) * 0.01  # flat: a large k
        out = host(ids, scores)
        with accelerator_route():
            expected = general(ids, scores)
        assert torch.equal(out, expected) and torch.equal(host.k, general.k)
        torch.testing.assert_close(host.mu, general.mu, rtol=1e-6, atol=1e-6)
        chosen = [int(torch.isfinite(out[row]).nonzero()[(step * 7) % int(torch.isfinite(out[row]).sum())])
                  for row in range(rows)]
        ids = torch.cat([ids, torch.tensor(chosen)[:, None]], 1)
    assert host._listed is not None or host._weights is not None
