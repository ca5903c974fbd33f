"""AdaptivePLogitsWarper against llama.cpp's `llama_sampler_adaptive_p_apply` / `_accept`, rewritten as a
plain per-row reference (Python floats); vectors worked by hand; per-row values; rows followed in
transformers' own `generate`; rollback; no host reads; errors."""

from __future__ import annotations

import math
import random

import pytest
import torch
from _host_reads import HostReads
from transformers import LogitsProcessorList

from hfbridge import Recompute, accelerator_route, generate, sample_step
from hfbridge.processors import AdaptivePLogitsWarper

from _tiny_models import model_cache, recompute_callable

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

_model = model_cache()
NEG_INF = float("-inf")


class Reference:
    """One row of llama.cpp's adaptive-p: the EMA state and the transform."""

    def __init__(self, target, decay):
        self.target, self.decay = target, decay
        self.weighted_sum, self.total_weight = target / (1 - decay), 1 / (1 - decay)
        self.probs = None

    def apply(self, logits):
        best = max(logits)
        exps = [math.exp(x - best) if x != NEG_INF else 0.0 for x in logits]
        probs = [e / sum(exps) for e in exps]
        if self.target < 0:
            self.probs = None
            return list(logits)
        target = min(max(self.target, 0.0), 1.0)
        adapted = target if self.total_weight == 0 else 2 * target - self.weighted_sum / self.total_weight
        adapted = min(max(adapted, 0.0), 1.0)
        out = []
        for x, p in zip(logits, probs):
            if x == NEG_INF:
                out.append(NEG_INF)
                continue
            d = abs((p - adapted) / 0.3)
            out.append(5.0 - 10.0 * d * d / (1 + d))
        self.probs = probs
        return out

    def accept(self, token, selected_by_us=True):
        if self.probs is not None and selected_by_us:
            self.weighted_sum = self.probs[token] + self.decay * self.weighted_sum
            self.total_weight = 1 + self.decay * self.total_weight


def test_a_vector_by_hand():
    warper = AdaptivePLogitsWarper(0.3, 0.9)
    scores = torch.tensor([[0.6, 0.3, 0.1]]).log()
    out = warper(torch.tensor([[0]]), scores)
    # fresh: weighted_sum 3, total 10: adapted = 2 * 0.3 - 0.3 = 0.3; d = (1, 0, 2/3)
    d = [1.0, 0.0, 2 / 3]
    torch.testing.assert_close(out[0], torch.tensor([5 - 10 * x * x / (1 + x) for x in d]))
    # token 0 (p = 0.6) chosen: weighted_sum 0.6 + 2.7 = 3.3, total 10: adapted = 0.6 - 0.33 = 0.27
    out = warper(torch.tensor([[0, 0]]), scores)
    torch.testing.assert_close(warper.state[0], torch.tensor([3.3, 10.0]))
    d = [abs(p - 0.27) / 0.3 for p in (0.6, 0.3, 0.1)]
    torch.testing.assert_close(out[0], torch.tensor([5 - 10 * x * x / (1 + x) for x in d]))


@pytest.mark.parametrize("seed", range(8))
def test_equals_the_reference_on_random_rows(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    rows, vocab = 3, 20
    targets = [rng.choice([-1.0, 0.0, 0.1, 0.5, 1.0]) for _ in range(rows)]
    decays = [rng.choice([0.0, 0.5, 0.9, 0.99]) for _ in range(rows)]
    warper = AdaptivePLogitsWarper(targets, decays)
    refs = [Reference(t, d) for t, d in zip(targets, decays)]
    ids = torch.randint(0, vocab, (rows, 3))
    for _ in range(12):
        scores = torch.randn(rows, vocab) * 2
        scores[:, rng.randrange(vocab)] = NEG_INF  # a token removed before it
        out = warper(ids, scores)
        chosen = []
        for row, ref in enumerate(refs):
            expected = ref.apply(scores[row].tolist())
            torch.testing.assert_close(out[row], torch.tensor(expected), rtol=1e-5, atol=1e-5)
            token = int(torch.multinomial(out[row].softmax(-1), 1))
            ref.accept(token)
            chosen.append(token)
        ids = torch.cat([ids, torch.tensor(chosen)[:, None]], 1)


def test_a_removed_token_chosen_leaves_the_average():
    warper = AdaptivePLogitsWarper(0.5, 0.5)
    scores = torch.tensor([[1.0, 0.0, NEG_INF]])
    warper(torch.tensor([[1]]), scores)
    warper(torch.tensor([[1, 2]]), scores)  # token 2 was at -inf: not this warper's choice
    torch.testing.assert_close(warper.state[0], torch.tensor([1.0, 2.0]))  # fresh values kept


def test_negative_target_passes_scores_through():
    scores = torch.randn(2, 7)
    assert torch.equal(AdaptivePLogitsWarper(-1.0)(torch.tensor([[1], [2]]), scores), scores)


def test_rollback_gives_the_state_of_a_run_that_never_saw_the_tokens():
    torch.manual_seed(0)
    scores = [torch.randn(1, 10) for _ in range(6)]
    tokens = [3, 1, 4, 1, 5, 9]
    warper = AdaptivePLogitsWarper(0.2, 0.8)
    for n in range(6):
        warper(torch.tensor([tokens[:n + 1]]), scores[n])
    warper.rollback(torch.tensor([3]))
    out = warper(torch.tensor([tokens[:3]]), scores[2])
    fresh = AdaptivePLogitsWarper(0.2, 0.8)
    for n in range(3):
        expected = fresh(torch.tensor([tokens[:n + 1]]), scores[n])
    assert torch.equal(out, expected) and torch.equal(warper.state, fresh.state)


PROMPT = torch.tensor([[5, 9, 13, 2, 7, 21], [0, 0, 3, 4, 11, 7]])
MASK = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])


@pytest.mark.parametrize("hf_options", [dict(do_sample=True, top_k=0), dict(do_sample=True, top_k=0, num_beams=2)])
def test_hf_generate_with_the_class_equals_hfbridge_with_the_options(hf_options):
    hf = _model("llama")
    torch.manual_seed(3)
    theirs = hf.generate(PROMPT, attention_mask=MASK, use_cache=False, max_new_tokens=12,
                         logits_processor=LogitsProcessorList([AdaptivePLogitsWarper(0.2, 0.7)]), **hf_options)
    torch.manual_seed(3)
    ours = generate(Recompute(recompute_callable(hf)), PROMPT, attention_mask=MASK, max_new_tokens=12,
                    adaptive_target=0.2, adaptive_decay=0.7, **hf_options)
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"


def test_option_places_it_last_and_turns_sampling_on():
    from hfbridge import build_processors

    built = build_processors(temperature=0.7, top_p=0.9, adaptive_target=0.4, renormalize_logits=True)
    assert [type(p).__name__ for p in built][-2:] == ["AdaptivePLogitsWarper", "LogitNormalization"]
    assert build_processors(adaptive_target=0.4, top_k=0)[0].decay.values == (0.9,)  # llama.cpp's default


def test_no_host_reads():
    warper = AdaptivePLogitsWarper([0.1, 0.6], [0.9, 0.5])
    ids = torch.tensor([[1], [2]])
    scores = torch.randn(2, 50)
    before = scores.clone()
    with accelerator_route(), HostReads() as reads:  # what an accelerator runs (on CPU a host read is free)
        for token in range(4):
            warper(ids, scores)
            ids = torch.cat([ids, torch.full((2, 1), token)], 1)
    assert reads.count == 0, reads.ops
    assert torch.equal(scores, before)


@pytest.mark.parametrize("options,error,message", [
    (dict(adaptive_target=1.5), ValueError, r"^`adaptive_target` must be <= 1.0, got 1.5.$"),
    (dict(adaptive_target=0.5, adaptive_decay=1.0), ValueError, r"^`adaptive_decay` must be <= 0.99, got 1.0.$"),
    (dict(adaptive_target=0.5, adaptive_decay=-0.1), ValueError, r"^`adaptive_decay` must be >= 0.0, got -0.1.$"),
    (dict(adaptive_target=float("nan")), ValueError, r"^`adaptive_target` must be a finite number, got nan.$"),
    (dict(adaptive_target="0.5"), TypeError, r"^`adaptive_target` must be a number, got str '0.5'.$"),
    (dict(adaptive_target=[0.1, 0.2, 0.3]), ValueError,
     r"^`adaptive_target` has 3 values, one per row, but the step has 2 rows; pass one value per row, or a single number "
     r"for every row.$"),
    (dict(adaptive_target=0.5, mirostat=2), ValueError, r"^`mirostat` and `adaptive_target` both choose"),
])
def test_option_errors_name_the_option(options, error, message):
    with pytest.raises(error, match=message):
        sample_step(torch.zeros(2, 8), torch.tensor([[1], [2]]), top_k=0, **options)


def test_a_step_without_context():
    scores = torch.randn(2, 9)
    expected = Reference(0.3, 0.9).apply(scores[0].tolist())
    out = AdaptivePLogitsWarper(0.3)(torch.zeros(2, 0, dtype=torch.long), scores)
    torch.testing.assert_close(out[0], torch.tensor(expected))
    assert sample_step(scores, adaptive_target=0.3, top_k=0).shape == (2,)
