"""The fast path: HF's surviving tokens and probabilities, HF's distribution, no multinomial."""

import doctest
import math

import pytest
import torch
from _zipf import zipf
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation import logits_process as hf

from hfbridge._step.fast import fast_path as _fast
from hfbridge._step.fast.fast_path import draw, fast_sample, fast_scores, top_candidates, top_p_mask

NEG_INF = float("-inf")
BOTH = pytest.mark.parametrize("candidates", [True, False], ids=["candidates", "fixed-shape"])


def assert_same_filter(ref: torch.Tensor, out: torch.Tensor) -> None:
    """`out` keeps what HF's `ref` keeps, with the same scores and the same renormalised probabilities.

    Where HF's choice among tokens of equal probability is unspecified (torch.sort and torch.topk
    order ties as they like; HF 4.46 and 5.x even rank differently), a row may keep other tokens of
    that probability: then the count and the sorted probabilities must still agree.

    One more case is HF's alone: exactly equal scores at the top-p cut, whose float32 running sum
    lands on the cut within rounding (n tokens of probability 1/n: HF's float32 `cumsum` of k/n may
    round either side of `1 - top_p`; the fast path sums in float64). There the count may differ,
    but only by tokens whose score equals the last kept score on both sides.
    """
    assert ref.shape == out.shape
    for row, (r, o) in enumerate(zip(ref, out)):
        kept_r, kept_o = r > NEG_INF, o > NEG_INF
        if torch.equal(kept_r, kept_o):
            assert torch.equal(r, o), f"row {row}: same tokens, different scores"
            continue
        counts = int(kept_o.sum()), int(kept_r.sum())
        if counts[0] != counts[1]:
            extra = torch.cat([r[kept_r & ~kept_o], o[kept_o & ~kept_r]])  # tokens one side keeps alone
            boundary = r[kept_r].min(), o[kept_o].min()
            assert bool((extra == boundary[0]).all() and (extra == boundary[1]).all()), (
                f"row {row}: kept {counts[0]}, HF {counts[1]}, and not only tokens tied at the cut")
            continue
        torch.testing.assert_close(torch.softmax(o, -1).sort(-1).values, torch.softmax(r, -1).sort(-1).values,
                                   rtol=1e-5, atol=1e-7)


def check(processors, scores, input_ids=None, candidates=True):
    processors = LogitsProcessorList(processors)
    ref = processors(input_ids, scores.clone())
    out = fast_scores(input_ids, scores.clone(), processors, candidates=candidates)
    assert_same_filter(ref, out)
    return ref, out


# --- equality with HF's processors ----------------------------------------------------------------

@st.composite
def logits(draw_):
    batch = draw_(st.integers(1, 4))
    vocab = draw_(st.integers(1, 700))
    seed = draw_(st.integers(0, 2**31 - 1))
    kind = draw_(st.sampled_from(["normal", "ties", "neg-inf", "zipf", "equal", "spiky"]))
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        x = torch.randn(batch, vocab, generator=g) * 3
    elif kind == "ties":  # few distinct values: ties at every boundary
        x = torch.randint(0, 4, (batch, vocab), generator=g).float()
    elif kind == "neg-inf":
        x = torch.randn(batch, vocab, generator=g)
        x[x < -0.3] = NEG_INF
        x[:, 0] = 2.0
    elif kind == "zipf":
        x = zipf(batch, vocab, seed)
    elif kind == "equal":
        x = torch.zeros(batch, vocab)
    else:  # one dominant token
        x = torch.randn(batch, vocab, generator=g)
        x[:, vocab // 2] = 30.0
    return x


@BOTH
@settings(max_examples=60, deadline=None)
@given(x=logits(), top_p=st.floats(0.0, 1.0), keep=st.integers(1, 4),
       temperature=st.sampled_from([1e-3, 0.3, 1.0, 2.5, 1e3]))
def test_top_p_equals_hf(candidates, x, top_p, keep, temperature):
    check([hf.TemperatureLogitsWarper(temperature), hf.TopPLogitsWarper(top_p, min_tokens_to_keep=keep)],
          x, candidates=candidates)


@BOTH
@settings(max_examples=40, deadline=None)
@given(x=logits(), top_k=st.integers(1, 800), keep=st.integers(1, 3), top_p=st.floats(0.05, 1.0))
def test_top_k_then_top_p_equals_hf(candidates, x, top_k, keep, top_p):
    check([hf.TemperatureLogitsWarper(0.7), hf.TopKLogitsWarper(top_k, min_tokens_to_keep=keep)], x,
          candidates=candidates)
    check([hf.TopKLogitsWarper(top_k), hf.TopPLogitsWarper(top_p, min_tokens_to_keep=keep)], x,
          candidates=candidates)


@BOTH
@settings(max_examples=30, deadline=None)
@given(x=logits(), min_p=st.floats(0.0, 1.0), keep=st.integers(1, 3))
def test_min_p_equals_hf(candidates, x, min_p, keep):
    check([hf.TemperatureLogitsWarper(0.8), hf.MinPLogitsWarper(min_p, min_tokens_to_keep=keep)], x,
          candidates=candidates)


@BOTH
@pytest.mark.parametrize("vocab", [32000, 50257])
def test_large_vocabularies_equal_hf(candidates, vocab):
    # Realistic and flat rows at full size: the candidate shortcut and the radix select both run.
    for x in (zipf(3, vocab, seed=vocab), torch.randn(3, vocab, generator=torch.Generator().manual_seed(1))):
        check([hf.TemperatureLogitsWarper(0.7), hf.TopPLogitsWarper(0.9)], x, candidates=candidates)
        check([hf.TemperatureLogitsWarper(1.0), hf.TopPLogitsWarper(0.95)], x, candidates=candidates)
        check([hf.TemperatureLogitsWarper(0.7), hf.TopKLogitsWarper(50), hf.TopPLogitsWarper(0.9)], x,
              candidates=candidates)
        check([hf.TemperatureLogitsWarper(0.7), hf.MinPLogitsWarper(0.05)], x, candidates=candidates)


@BOTH
def test_adversarial_rows(candidates):
    # Ties at the top-k boundary: HF keeps every token equal to the k-th.
    x = torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0, 0.0]])
    _, out = check([hf.TopKLogitsWarper(2)], x, candidates=candidates)
    assert (out > NEG_INF).tolist() == [[True, True, True, True, False, False]]
    # top_k larger than the vocabulary keeps everything.
    check([hf.TopKLogitsWarper(100)], x, candidates=candidates)
    # Cumulative sums that hit 1 - top_p exactly (powers of two): 0.25, 0.5, 0.75, 1.
    check([hf.TopPLogitsWarper(0.5)], torch.zeros(2, 4), candidates=candidates)
    check([hf.TopPLogitsWarper(0.75)], torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]])), candidates=candidates)
    # -inf entries, a row with one finite token, top_p 0 and 1.
    y = torch.tensor([[NEG_INF, 0.0, NEG_INF, 1.0], [NEG_INF, NEG_INF, 2.0, NEG_INF]])
    for top_p in (0.0, 0.3, 1.0):
        check([hf.TopPLogitsWarper(top_p)], y, candidates=candidates)
        check([hf.TopPLogitsWarper(top_p, min_tokens_to_keep=3)], y, candidates=candidates)
    # A tail of tiny probabilities: HF's ascending cumsum sees them (> 0), so top_p=1 keeps them.
    tail = torch.tensor([[1.5, 30.0, -20.0], [NEG_INF, 40.0, 0.0]])
    for processors in ([hf.TopKLogitsWarper(3), hf.TopPLogitsWarper(1.0)], [hf.TopPLogitsWarper(1.0)],
                       [hf.TopKLogitsWarper(2), hf.TopPLogitsWarper(0.999999)]):
        check(processors, tail, candidates=candidates)
    # Huge and tiny temperatures; min_tokens_to_keep beyond the vocabulary.
    z = torch.randn(3, 9, generator=torch.Generator().manual_seed(3))
    for t in (1e-4, 1e4):
        check([hf.TemperatureLogitsWarper(t), hf.TopPLogitsWarper(0.5, min_tokens_to_keep=20)], z,
              candidates=candidates)
        check([hf.TemperatureLogitsWarper(t), hf.MinPLogitsWarper(0.5, min_tokens_to_keep=4)], z, candidates=candidates)


def test_equal_probabilities_at_the_threshold_keep_lowest_ids():
    # HF keeps 2 of 4 equal tokens, in torch.sort's (unspecified) order; the fast path the lowest ids.
    for candidates in (True, False):
        out = fast_scores(None, torch.zeros(1, 4), [hf.TopPLogitsWarper(0.5)], candidates=candidates)
        assert (out > NEG_INF).tolist() == [[True, True, False, False]]
        out = fast_scores(None, torch.tensor([[1.0, 0.0, 0.0, 0.0, 1.0]]), [hf.TopPLogitsWarper(0.3)],
                          candidates=candidates)
        assert (out > NEG_INF).tolist() == [[True, False, False, False, False]]


def test_top_p_mask_is_the_radix_select():
    probs = torch.softmax(torch.randn(4, 1000, generator=torch.Generator().manual_seed(5)), dim=-1)
    scores = torch.log(probs)
    for top_p in (0.1, 0.5, 0.9, 0.999):
        ref = hf.TopPLogitsWarper(top_p)(None, scores.clone()) > NEG_INF
        assert torch.equal(top_p_mask(probs, top_p), ref)


def test_top_candidates_are_the_top_k():
    x = torch.randint(0, 50, (3, 5000), generator=torch.Generator().manual_seed(2)).float()
    x[:, -7:] = 100.0  # in the short last block
    for k in (1, 10, 60):
        values, ids = top_candidates(x, k)
        assert torch.equal(values, torch.topk(x, k).values)
        assert torch.equal(x.gather(1, ids), values)
        assert all(len(set(row.tolist())) == k for row in ids)


def test_custom_filter_values():
    x = torch.randn(2, 30, generator=torch.Generator().manual_seed(4))
    processors = [hf.TemperatureLogitsWarper(0.5), hf.TopKLogitsWarper(5, filter_value=-100.0),
                  hf.TopPLogitsWarper(0.8, filter_value=-50.0), hf.MinPLogitsWarper(0.2, filter_value=-1000.0)]
    for candidates in (True, False):
        ref = LogitsProcessorList(processors)(None, x.clone())
        assert torch.equal(fast_scores(None, x.clone(), processors, candidates=candidates), ref)


# --- processors the fast path does not know ------------------------------------------------------

class Recorder(LogitsProcessor):
    """A real (non-HF) processor: adds a bias to one token and records what it saw."""

    def __init__(self, token, bias, log):
        self.token, self.bias, self.log = token, bias, log

    def __call__(self, input_ids, scores):
        self.log.append((self.token, scores.clone()))
        scores = scores.clone()
        scores[:, self.token] += self.bias
        return scores


class HalfTopP(hf.TopPLogitsWarper):
    """A subclass that changes `__call__`: must run as written, not as the fused top-p."""

    def __call__(self, input_ids, scores):
        return super().__call__(input_ids, scores / 2)


def test_unknown_processors_run_through_hf_in_order():
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(6))
    ids = torch.randint(0, 40, (3, 7), generator=torch.Generator().manual_seed(7))
    seen_ref, seen_fast = [], []

    def chain(log):
        return [hf.RepetitionPenaltyLogitsProcessor(1.3), hf.TemperatureLogitsWarper(0.7), Recorder(3, 5.0, log),
                hf.TopKLogitsWarper(20), Recorder(9, 2.0, log), hf.TopPLogitsWarper(0.9), HalfTopP(0.8)]

    ref = LogitsProcessorList(chain(seen_ref))(ids, x.clone())
    out = fast_scores(ids, x.clone(), LogitsProcessorList(chain(seen_fast)))
    assert torch.equal(out, ref)
    assert [t for t, _ in seen_fast] == [3, 9]
    for (_, a), (_, b) in zip(seen_ref, seen_fast):
        assert torch.equal(a, b)  # each unknown processor saw exactly HF's scores


# --- the draw -------------------------------------------------------------------------------------

CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322, 8: 26.124,
            9: 27.877, 10: 29.588, 11: 31.264, 12: 32.909, 13: 34.528, 14: 36.123, 15: 37.697}


def chi_square(tokens, expected):
    """Pearson's statistic of token counts against expected probabilities, and its degrees of freedom."""
    counts = torch.bincount(tokens, minlength=expected.numel()).double()
    support = expected > 0
    assert counts[~support].sum() == 0, "drew a token HF's filters removed"
    e = expected[support].double() * tokens.numel()
    return float(((counts[support] - e) ** 2 / e).sum()), int(support.sum()) - 1


@pytest.mark.parametrize("candidates", [True, False], ids=["candidates", "two-level"])
@pytest.mark.parametrize("name", ["top-p", "top-k+top-p", "min-p"])
def test_draws_follow_hfs_distribution(candidates, name):
    x = torch.tensor([[2.0, 1.5, 1.5, 1.0, 0.3, -0.5, -1.0, -3.0, 0.9, 1.2, NEG_INF, 0.1]])
    processors = {
        "top-p": [hf.TemperatureLogitsWarper(0.8), hf.TopPLogitsWarper(0.9)],
        "top-k+top-p": [hf.TopKLogitsWarper(6), hf.TopPLogitsWarper(0.95)],
        "min-p": [hf.TemperatureLogitsWarper(1.5), hf.MinPLogitsWarper(0.1)],
    }[name]
    expected = torch.softmax(LogitsProcessorList(processors)(None, x.clone()), dim=-1)[0]
    n = 40_000
    tokens = fast_sample(None, x.expand(n, -1).clone(), processors, torch.Generator().manual_seed(11),
                         candidates=candidates)
    stat, df = chi_square(tokens, expected)
    assert 3 <= df <= 15
    assert stat < CHI2_999[df], f"chi-square {stat:.1f} with {df} degrees of freedom"


def test_two_level_draw_distribution_and_zero_weights():
    weights = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 2.0, 0.25, 0.0, 1.5, 0.75])  # 3 blocks of 4
    n = 40_000
    tokens = draw(weights.expand(n, -1), torch.Generator().manual_seed(3), block=4)
    stat, df = chi_square(tokens, weights / weights.sum())
    assert stat < CHI2_999[df]
    # A single non-zero weight, far from the others, always wins; so does a tiny one among zeros.
    w = torch.zeros(5, 1000)
    w[torch.arange(5), torch.tensor([0, 999, 500, 31, 32])] = torch.tensor([1.0, 1e-30, 5.0, 1e-38, 2.0])
    assert draw(w, torch.Generator().manual_seed(0)).tolist() == [0, 999, 500, 31, 32]


@BOTH
def test_generator_reproducibility(candidates):
    x = zipf(4, 3000, seed=8)
    processors = [hf.TemperatureLogitsWarper(1.0), hf.TopPLogitsWarper(0.95)]

    def run(seed):
        return fast_sample(None, x.clone(), processors, torch.Generator().manual_seed(seed), candidates=candidates)

    assert torch.equal(run(1), run(1))
    assert any(not torch.equal(run(1), run(s)) for s in range(2, 6))
    torch.manual_seed(5)
    a = fast_sample(None, x.clone(), processors, candidates=candidates)
    torch.manual_seed(5)
    assert torch.equal(a, fast_sample(None, x.clone(), processors, candidates=candidates))


def test_input_ids_untouched_and_shapes():
    x = torch.randn(2, 50)
    ids = torch.randint(0, 50, (2, 5))
    before = ids.clone()
    processors = [hf.RepetitionPenaltyLogitsProcessor(1.2), hf.TopKLogitsWarper(5)]
    tokens = fast_sample(ids, x.clone(), processors, torch.Generator().manual_seed(0))
    assert torch.equal(ids, before)
    assert tokens.shape == (2,) and tokens.dtype == torch.long
    with pytest.raises(ValueError, match="float32"):
        fast_sample(None, x.double(), processors)


# --- torch.compile ---------------------------------------------------------------------------------

def test_compiled_step_keeps_the_same_tokens():
    processors = LogitsProcessorList([hf.TemperatureLogitsWarper(0.7), hf.TopKLogitsWarper(40),
                                      hf.TopPLogitsWarper(0.9), hf.MinPLogitsWarper(0.02)])
    x = zipf(2, 300, seed=9)

    def step(scores):
        return fast_scores(None, scores, processors, candidates=False)

    try:  # fullgraph: the fixed-shape path has no data-dependent Python control flow
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        out = compiled(x.clone())
    except Exception as error:  # pragma: no cover - depends on the machine's compiler toolchain
        if "fullgraph" in str(error) or "graph break" in str(error).lower():
            raise
        pytest.skip(f"torch.compile is unavailable here: {type(error).__name__}: {error}"[:300])
    assert_same_filter(processors(None, x.clone()), out)
    # The draw compiles too, seeded by the global RNG (dynamo cannot trace a torch.Generator argument).
    sample = torch.compile(lambda s: fast_sample(None, s, processors, None, candidates=False),
                           backend="aot_eager", fullgraph=True)
    torch.manual_seed(0)
    tokens = sample(x.clone())
    assert bool((out.gather(1, tokens[:, None]) > NEG_INF).all())


def test_docstring_examples():
    failures, tried = doctest.testmod(_fast, optionflags=doctest.ELLIPSIS)
    assert tried > 5 and failures == 0


def test_block_size_default_is_near_sqrt_vocab():
    w = torch.ones(1, 128256)
    assert 0 <= int(draw(w, torch.Generator().manual_seed(0))) < 128256
    assert 1 << round(math.log2(128256) / 2) == 256


@BOTH
def test_rows_with_nothing_left_do_not_crash(candidates):
    # HF's multinomial raises on such rows; the fast path cannot check without a sync, but must not
    # index out of range (a device-side assert on GPU).
    x = torch.randn(3, 3000, generator=torch.Generator().manual_seed(12))
    x[1] = NEG_INF
    for processors in ([hf.TemperatureLogitsWarper(0.7), hf.TopPLogitsWarper(0.9)], [hf.TopKLogitsWarper(5)],
                       [hf.MinPLogitsWarper(0.1)], [hf.TopPLogitsWarper(0.9, min_tokens_to_keep=2)]):
        tokens = fast_sample(None, x.clone(), processors, torch.Generator().manual_seed(0), candidates=candidates)
        assert tokens.shape == (3,) and bool(((tokens >= 0) & (tokens < 3000)).all())
