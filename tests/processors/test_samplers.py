"""hfbridge.processors against the plain per-row references of tests/_samplers_reference.py.

Random rows (hypothesis): repeats over small alphabets, multi-token breakers, windows, ties, and
`-inf` entries left by earlier processors. Then: a batch with one value per row equals each row
run alone; no processor writes into its input; XTC's rate under `probability`; mirostat's mu.
"""

from __future__ import annotations

import contextlib
import math

import _samplers_reference as ref
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hfbridge import accelerator_route
from hfbridge.processors import (
    DRYLogitsProcessor,
    DynamicTemperatureLogitsWarper,
    MirostatLogitsWarper,
    PresenceFrequencyPenaltyLogitsProcessor,
    SmoothingLogitsWarper,
    TopNSigmaLogitsWarper,
    XTCLogitsWarper,
)

NEG_INF = -math.inf


@st.composite
def rows(draw, vocab=None, removed=True):
    vocab = vocab or draw(st.integers(2, 40))
    values = draw(st.lists(st.floats(-8, 8, width=32), min_size=vocab, max_size=vocab))
    if draw(st.booleans()):  # ties
        values = [round(v) for v in values]
    if removed:
        gone = draw(st.lists(st.integers(0, vocab - 1), max_size=vocab - 1))
        values = [NEG_INF if i in gone else v for i, v in enumerate(values)]
        assume(any(v != NEG_INF for v in values))
    return values


def scores_of(values):
    return torch.tensor([values], dtype=torch.float32)


@st.composite
def dry_cases(draw):
    vocab = draw(st.integers(2, 8))
    alphabet = draw(st.integers(1, vocab))
    tokens = draw(st.lists(st.integers(0, alphabet - 1), max_size=70))
    breakers = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=3), max_size=3))
    return dict(vocab=vocab, tokens=tokens, breakers=breakers, values=draw(rows(vocab)),
                multiplier=draw(st.sampled_from([0.0, 0.5, 1.0, 2.5])), base=draw(st.sampled_from([1.0, 1.1, 1.75, 3.0])),
                allowed=draw(st.integers(1, 4)), last_n=draw(st.sampled_from([-1, 0, 1, 3, 8, 20, 100])))


@settings(max_examples=300, deadline=None)
@given(case=dry_cases())
def test_dry_matches_the_reference(case):
    dry = DRYLogitsProcessor(case["multiplier"], case["base"], case["allowed"], case["last_n"],
                             sequence_breakers=case["breakers"])
    got = dry(torch.tensor([case["tokens"]], dtype=torch.long).reshape(1, -1), scores_of(case["values"]))[0]
    expected = ref.dry(case["tokens"], case["values"], multiplier=case["multiplier"], base=case["base"],
                       allowed=case["allowed"], last_n=case["last_n"],
                       breakers=[(b[0], tuple(b[1:])) for b in case["breakers"]])
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), rtol=1e-6, atol=1e-5)


@st.composite
def dry_batches(draw):
    rows = draw(st.integers(1, 5))
    vocab = draw(st.integers(2, 9))
    alphabet = draw(st.integers(1, vocab))
    length = draw(st.integers(1, 90))
    tokens = [draw(st.lists(st.integers(0, alphabet - 1), min_size=length, max_size=length)) for _ in range(rows)]
    if draw(st.booleans()):  # a long repeat in the first row
        tokens[0] = ([1 % vocab, 0] * length)[:length]
    per_row = draw(st.booleans())

    def value(options):
        return [draw(st.sampled_from(options)) for _ in range(rows)] if per_row else draw(st.sampled_from(options))

    scores = torch.tensor([draw(rows_of(vocab)) for _ in range(rows)], dtype=torch.float32)
    return dict(tokens=torch.tensor(tokens), scores=scores.to(draw(st.sampled_from(DTYPES))),
                breakers=draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=3), max_size=3)),
                multiplier=value([0.0, 0.5, 1.0, 2.5]), base=value([1.0, 1.1, 1.75, 3.0]),
                allowed=value([1, 2, 3, 4]), last_n=value([-1, 0, 1, 3, 8, 20, 100]))


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def rows_of(vocab):
    return rows(vocab)


@settings(max_examples=300, deadline=None)
@given(case=dry_batches())
def test_dry_host_path_equals_the_batched_path(case):
    """CPU batches search each row with NumPy; what an accelerator runs (`accelerator_route`) is batched."""
    dry = DRYLogitsProcessor(case["multiplier"], case["base"], case["allowed"], case["last_n"],
                             sequence_breakers=case["breakers"])
    ids, scores = case["tokens"], case["scores"]
    before = scores.clone()
    host = dry(ids, scores)
    with accelerator_route():
        batched = dry(ids, scores)
    assert torch.equal(scores, before)  # the caller's scores are never written
    torch.testing.assert_close(host, batched, rtol=0, atol=0, equal_nan=True)


def test_dry_long_repeat_and_exponent_cap():
    tokens = [1, 2, 3] * 200  # a repeat of ~600 tokens: llama.cpp caps the exponent at int(88.72 / log 1.75)
    expected = ref.dry(tokens, [0.0] * 5, multiplier=1e-30, base=1.75, allowed=2, last_n=-1, breakers=[])
    got = DRYLogitsProcessor(1e-30, 1.75, 2, -1, sequence_breakers=[])(torch.tensor([tokens]), torch.zeros(1, 5))
    torch.testing.assert_close(got[0], torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=0)
    assert got[0, 1] == pytest.approx(-1e-30 * 1.75 ** 158, rel=1e-5)  # token 1 would continue 1 2 3 ... 3


def test_dry_string_breakers_follow_llama_cpp_rules():
    from hfbridge.processors._dry_breakers import compile_breakers

    class Tokenizer:  # the vocabulary: 0 "a", 1 "b", 2 "\n", 3 "x\n", 4 "U", 5 "ser", 6 "Us", 7 "er:"
        words = ["a", "b", "\n", "x\n", "U", "ser", "Us", "er:"]

        def __len__(self):
            return len(self.words)

        def batch_decode(self, ids):
            return [self.words[i[0]] for i in ids]

        def encode(self, text, add_special_tokens=False):
            return {"ser": [5], "er": [7], "er:": [7]}.get(text, [0])

    breakers = compile_breakers(["\n", "User"], Tokenizer())
    assert breakers.singles == {2, 3}  # every token containing "\n"
    assert breakers.tails == {(5,): {4}, (7,): {6}}  # "U" + tokenize("ser"), "Us" + tokenize("er")


@settings(max_examples=200, deadline=None)
@given(values=rows(), threshold=st.sampled_from([0.05, 0.1, 0.2, 0.3, 0.5, 0.9]), keep=st.integers(1, 5),
       applies=st.booleans())
def test_xtc_matches_the_reference(values, threshold, keep, applies):
    probs = ref.softmax(values)
    assume(all(abs(p - threshold) > 1e-5 for p in probs))  # float32 vs float64 at the boundary
    warper = XTCLogitsWarper(threshold, 1.0 if applies else 0.0, min_tokens_to_keep=keep)
    got = warper(None, scores_of(values))[0].tolist()
    assert got == ref.xtc(values, threshold=threshold, applies=applies, min_keep=keep)


@settings(max_examples=200, deadline=None)
@given(values=rows(), n=st.sampled_from([0.1, 0.5, 1.0, 2.0, 3.0]))
def test_top_n_sigma_matches_the_reference(values, n):
    expected, floor = ref.top_n_sigma(values, n)
    assume(all(abs(v - floor) > 1e-4 for v in values if v != NEG_INF))
    assert TopNSigmaLogitsWarper(n)(None, scores_of(values))[0].tolist() == expected


@settings(max_examples=200, deadline=None)
@given(values=rows(vocab=12), tokens=st.lists(st.integers(0, 11), max_size=30), prompt=st.integers(0, 10),
       presence=st.sampled_from([0.0, 0.5, -1.0]), frequency=st.sampled_from([0.0, 0.25, 2.0]),
       repeat=st.sampled_from([1.0, 1.3]), last_n=st.sampled_from([None, -1, 0, 1, 5]))
def test_penalties_match_the_reference(values, tokens, prompt, presence, frequency, repeat, last_n):
    ids = torch.tensor([tokens], dtype=torch.long).reshape(1, -1)
    processor = PresenceFrequencyPenaltyLogitsProcessor(presence, frequency, last_n, prompt_length=prompt,
                                                        repetition_penalty=repeat)
    window = tokens[prompt:] if last_n is None else tokens if last_n == -1 else tokens[max(len(tokens) - last_n, 0):] \
        if last_n else []
    expected = ref.penalties(window, values, presence=presence, frequency=frequency, repeat=repeat)
    got = processor(ids, scores_of(values))[0]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), rtol=1e-6, atol=1e-5)


@settings(max_examples=200, deadline=None)
@given(values=rows(), temperature=st.sampled_from([0.0, 0.3, 1.0, 1.5]), spread=st.sampled_from([0.0, 0.2, 1.0, 2.0]),
       exponent=st.sampled_from([0.5, 1.0, 2.0]))
def test_dynamic_temperature_matches_the_reference(values, temperature, spread, exponent):
    expected = ref.dynamic_temperature(values, temperature=temperature, spread=spread, exponent=exponent)
    got = DynamicTemperatureLogitsWarper(temperature, spread, exponent)(None, scores_of(values))[0]
    assume(not (temperature - spread <= 0 and any(0 < abs(v) < 1e-3 for v in expected)))
    # float32 entropy against the double reference: near T = 0 (range reaching 0) the division by a small T
    # magnifies its rounding, and the summation order differs with the thread count (1.2e-4 seen)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), rtol=1e-3, atol=1e-4)


@settings(max_examples=200, deadline=None)
@given(values=rows(), factor=st.sampled_from([0.0, 0.1, 0.5, 2.0]), curve=st.sampled_from([1.0, 1.5, 3.0, 5.0]))
def test_smoothing_matches_the_reference(values, factor, curve):
    expected = ref.smoothing(values, factor=factor, curve=curve)
    got = SmoothingLogitsWarper(factor, curve)(None, scores_of(values))[0]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-3)


def test_mirostat_mu_follows_the_step_by_step_reference():
    torch.manual_seed(0)
    tau, eta, vocab = torch.tensor([3.0, 5.0]), [0.1, 0.5], 50
    warper = MirostatLogitsWarper(tau, eta)
    ids = torch.tensor([[1], [2]])
    mus = [2 * 3.0, 2 * 5.0]  # mu starts at 2 tau
    trajectory = []
    for _ in range(15):
        scores = torch.randn(2, vocab) * 3
        out = warper(ids, scores)
        torch.testing.assert_close(warper.mu, torch.tensor(mus), rtol=1e-5, atol=1e-5)  # the mu this step used
        chosen = []
        for row in range(2):
            kept, renormalised = ref.mirostat_keep(scores[row].tolist(), mus[row])
            assert torch.isfinite(out[row]).nonzero().flatten().tolist() == kept
            token = kept[len(kept) // 2]
            chosen.append(token)
            mus[row] -= eta[row] * (-math.log2(renormalised[token]) - tau[row].item())
        trajectory.append(list(mus))
        ids = torch.cat([ids, torch.tensor(chosen)[:, None]], dim=1)
    assert len({tuple(m) for m in trajectory}) > 5  # mu moved


def test_mirostat_starts_fresh_for_another_sequence():
    warper = MirostatLogitsWarper(2.0, 1.0)
    scores = torch.tensor([[3.0, 0.0, -1.0]])
    warper(torch.tensor([[0, 1]]), scores)
    warper(torch.tensor([[0, 1, 0]]), scores)
    assert warper.mu.item() != 4.0
    warper(torch.tensor([[5, 1, 0, 1]]), scores)  # one longer, but another prefix: a new sequence
    assert warper.mu.item() == 4.0


def test_xtc_rate_follows_probability():
    # 2000 rows with two tokens above the threshold: XTC applies to Binomial(2000, 0.3) of them
    rows_, probability = 2000, 0.3
    scores = torch.tensor([[2.0, 2.0, 0.0]]).repeat(rows_, 1)
    warper = XTCLogitsWarper(0.1, probability, generator=torch.Generator().manual_seed(1))
    applied = (warper(None, scores) == NEG_INF).any(-1).sum().item()
    sd = math.sqrt(rows_ * probability * (1 - probability))
    assert abs(applied - rows_ * probability) < 5 * sd


CLASSES = [
    (DRYLogitsProcessor, dict(multiplier=[0.0, 1.0, 2.0], base=[1.75, 1.1, 2.0], allowed_length=[2, 1, 3],
                              penalty_last_n=[-1, 5, 12], sequence_breakers=[[3], [4, 5]])),
    (XTCLogitsWarper, dict(threshold=[0.05, 0.1, 0.3], probability=[1.0, 0.0, 1.0])),
    (TopNSigmaLogitsWarper, dict(n=[0.5, 1.0, 2.0])),
    (PresenceFrequencyPenaltyLogitsProcessor, dict(presence_penalty=[0.0, 0.5, 1.0], frequency_penalty=[1.0, 0.0, 0.2],
                                                   penalty_last_n=[-1, 3, 0], repetition_penalty=[1.0, 1.2, 2.0])),
    (DynamicTemperatureLogitsWarper, dict(temperature=[0.5, 1.0, 1.5], range=[0.0, 0.5, 2.0], exponent=[1.0, 2.0, 0.5])),
    (SmoothingLogitsWarper, dict(factor=[0.0, 0.3, 1.0], curve=[1.0, 2.0, 4.0])),
    (MirostatLogitsWarper, dict(tau=[1.0, 3.0, 5.0], eta=[0.1, 0.2, 0.3])),
]


@pytest.mark.parametrize("cls,params", CLASSES, ids=lambda c: getattr(c, "__name__", ""))
def test_per_row_values_equal_each_row_alone(cls, params):
    torch.manual_seed(0)
    ids = torch.randint(0, 6, (3, 40))
    scores = torch.randn(3, 30) * 2
    scores[1, :4] = NEG_INF
    batched = cls(**params)(ids, scores.clone())
    for row in range(3):
        alone = cls(**{name: value[row] if isinstance(value, list) and name != "sequence_breakers" else value
                       for name, value in params.items()})
        torch.testing.assert_close(alone(ids[row:row + 1], scores[row:row + 1].clone())[0], batched[row])


@pytest.mark.parametrize("cls,params", CLASSES, ids=lambda c: getattr(c, "__name__", ""))
def test_input_left_unchanged(cls, params):
    ids = torch.randint(0, 6, (3, 40))
    scores = torch.randn(3, 30)
    before = scores.clone(), ids.clone()
    cls(**params)(ids, scores)
    assert torch.equal(scores, before[0]) and torch.equal(ids, before[1])


@pytest.mark.parametrize("cls,params", CLASSES, ids=lambda c: getattr(c, "__name__", ""))
def test_wrong_row_count_names_the_parameter(cls, params):
    with pytest.raises(ValueError, match=r"^`\w+` has 3 values, one per row, but the scores have 2 rows; pass one "
                                         r"value per row, or a single number for every row.$"):
        cls(**params)(torch.zeros(2, 40, dtype=torch.long), torch.zeros(2, 30))


@pytest.mark.parametrize("make,message", [
    (lambda: DRYLogitsProcessor(1.0, base=0.9), r"`base` must be >= 1.0, got 0.9."),
    (lambda: DRYLogitsProcessor(-1.0), r"`multiplier` must be >= 0.0, got -1.0."),
    (lambda: DRYLogitsProcessor(1.0, allowed_length=0), r"`allowed_length` must be >= 1, got 0."),
    (lambda: DRYLogitsProcessor(1.0, allowed_length=2.0), r"`allowed_length` must be an int, got float 2.0."),
    (lambda: DRYLogitsProcessor(1.0), r"DRY's sequence breakers .* are strings: pass `tokenizer=`"),
    (lambda: DRYLogitsProcessor(1.0, sequence_breakers=[[]]), r"`sequence_breakers\[0\]` must be a string"),
    (lambda: XTCLogitsWarper(0.0), r"`threshold` must be > 0.0, got 0.0."),
    (lambda: XTCLogitsWarper(1.5), r"`threshold` must be <= 1.0, got 1.5."),
    (lambda: XTCLogitsWarper(0.1, -0.1), r"`probability` must be >= 0.0, got -0.1."),
    (lambda: XTCLogitsWarper(0.1, [0.5, math.nan]), r"`probability\[1\]` \(row 1\) must be a finite number, got nan."),
    (lambda: TopNSigmaLogitsWarper(-1.0), r"`n` must be > 0.0, got -1.0."),
    (lambda: TopNSigmaLogitsWarper(True), r"`n` must be a number, got bool True."),
    (lambda: MirostatLogitsWarper(tau=0.0), r"`tau` must be > 0.0, got 0.0."),
    (lambda: SmoothingLogitsWarper(0.5, curve=0.5), r"`curve` must be >= 1.0, got 0.5."),
    (lambda: DynamicTemperatureLogitsWarper(1.0, -0.5), r"`range` must be >= 0.0, got -0.5."),
    (lambda: PresenceFrequencyPenaltyLogitsProcessor(0.5), r"need `prompt_length=`.*`penalty_last_n=`"),
    (lambda: TopNSigmaLogitsWarper(torch.ones(2, 2)), r"`n` must be a number or one number per row"),
])
def test_bad_values_are_clear_errors(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


@pytest.mark.parametrize("cls,params", CLASSES, ids=lambda c: getattr(c, "__name__", ""))
def test_no_host_reads(cls, params):
    from _host_reads import HostReads

    processor = cls(**params)
    ids = torch.randint(0, 6, (3, 40))
    processor(ids, torch.randn(3, 30))  # a first call (mirostat: the step before)
    with accelerator_route(), HostReads() as reads:  # what an accelerator runs: CPU's host paths off
        processor(torch.cat([ids, ids[:, :1]], dim=1), torch.randn(3, 30))
    assert reads.count == 0, reads.ops


@pytest.mark.parametrize("vocab", [1000, 128 * 40, 128 * 40 + 77])
def test_xtc_block_prefilter_finds_the_top_choices(vocab):
    torch.manual_seed(vocab)
    scores = torch.randn(16, vocab) * 2
    scores[:, -3:] += 9  # the top choices in the partial last block
    scores[::2, :5] += 12  # and in the first one
    scores[3, 100:110] = 8.0  # ties
    warper = XTCLogitsWarper(0.05, 1.0)
    got = warper(None, scores)
    for row in range(16):
        expected = ref.xtc(scores[row].tolist(), threshold=0.05, applies=True)
        assert got[row].tolist() == expected


def test_the_package_imports_only_torch_and_transformers():
    import ast
    from pathlib import Path

    import hfbridge.processors

    allowed = {"torch", "transformers", "numpy", "__future__"}  # numpy: a dependency of transformers
    for path in Path(hfbridge.processors.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in allowed or top in __import__("sys").stdlib_module_names \
                    or name.startswith("hfbridge.processors"), f"{path.name} imports {name}"


def test_string_breakers_with_a_real_tokenizer():
    from hfbridge.demo import load_demo_tokenizer
    from hfbridge.processors._dry_breakers import compile_breakers

    tokenizer = load_demo_tokenizer()
    words = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    breakers = compile_breakers(["\n", "Sam said:"], tokenizer)
    assert breakers.singles == {i for i, w in enumerate(words) if "\n" in w or "Sam said:" in w}
    # a token ending with a prefix of "Sam said:" heads a breaker whose tail is the rest, tokenized
    expected: dict[tuple, set] = {}
    for i, word in enumerate(words):
        if "Sam said:" in word:
            continue
        for start in range(len(word)):
            rest = word[start:]
            if rest and "Sam said:".startswith(rest):
                tail = tuple(tokenizer.encode("Sam said:"[len(rest):], add_special_tokens=False))
                expected.setdefault(tail, set()).add(i)
    assert breakers.tails == expected and expected  # "Sam" + " said:" at least
    ids = torch.tensor([tokenizer("Sam said: hello. Sam said: hello.").input_ids])
    dry = DRYLogitsProcessor(1.0, tokenizer=tokenizer, sequence_breakers=["Sam said:"])
    out = dry(ids, torch.zeros(1, len(tokenizer)))[0]
    pairs = [(head, ()) for head in breakers.singles] + [(h, t) for t, heads in breakers.tails.items() for h in heads]
    expected_scores = ref.dry(ids[0].tolist(), [0.0] * len(tokenizer), multiplier=1.0, base=1.75, allowed=2,
                              last_n=-1, breakers=pairs)
    assert out.tolist() == pytest.approx(expected_scores)
    # the repeat " hello." may reach back to the breaker only: " Sam" would extend a 4-token repeat
    assert out.nonzero().flatten().tolist() == [ids[0, 7].item()]
    assert out[ids[0, 7]].item() == pytest.approx(-1.75 ** 2)


@pytest.mark.parametrize("cls,params", CLASSES, ids=lambda c: getattr(c, "__name__", ""))
def test_a_row_with_nothing_left_stays_so_and_an_empty_batch_works(cls, params):
    scores = torch.randn(3, 30)
    scores[1] = NEG_INF  # an earlier processor removed everything: exact mode's error names that one
    out = cls(**params)(torch.randint(0, 6, (3, 40)), scores)
    assert bool((out[1] == NEG_INF).all()) and not bool(out.isnan().any())
    single = {name: value[0] if isinstance(value, list) and name != "sequence_breakers" else value
              for name, value in params.items()}
    assert cls(**single)(torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, 30)).shape == (0, 30)


def test_dry_writes_in_place_only_into_scores_it_owns():
    from hfbridge import Sampler
    from hfbridge.processors._cpu_side import owned_scores

    ids = torch.tensor([[0, 1, 2, 0, 1]])
    dry = DRYLogitsProcessor(1.0, base=1.1, sequence_breakers=[])
    for device_only in (False, True):  # the host path and the batched path
        with accelerator_route() if device_only else contextlib.nullcontext():
            scores = torch.zeros(1, 4)
            out = dry(ids, scores)
            assert out is not scores and torch.equal(scores, torch.zeros(1, 4))
            assert out.tolist() == [[0.0, 0.0, -1.0, 0.0]]
            with owned_scores():
                mine = torch.zeros(1, 4)
                assert dry(ids, mine) is mine and torch.equal(mine, out)
    logits = torch.zeros(1, 4)  # a Sampler lends its own float32 copy, never the caller's logits
    for fast in (False, True):
        sampler = Sampler(do_sample=True, top_k=0, dry_multiplier=1e9, dry_base=1.1, dry_sequence_breakers=[],
                          fast=fast)
        assert sampler(logits, ids).item() != 2 and torch.equal(logits, torch.zeros(1, 4))
