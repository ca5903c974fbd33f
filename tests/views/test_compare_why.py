"""Why the chains part, in each sampler's own terms: DRY's repeats, XTC's coin, a thinking budget's forcing
(`describe_last`, shown by explain_step and compare_step), a banned string's rollbacks (compare_generation).
Every expected value is worked out by hand in the comments (the seeded random check: against the step itself)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from hfbridge import accelerator_route, compare_generation, compare_step, explain_step
from hfbridge.processors import DRYLogitsProcessor, ThinkingBudgetLogitsProcessor, XTCLogitsWarper

# two repeats of the ending "4 1 2 3": "4 1 2 3" at 0-3 (then 9), "2 3" at 6-7 (then 8)
IDS = torch.tensor([[4, 1, 2, 3, 9, 0, 2, 3, 8, 4, 1, 2, 3]])


def test_dry_says_each_penalised_tokens_repeat_and_penalty():
    dry = DRYLogitsProcessor(1.0, base=2.0, allowed_length=2, sequence_breakers=[])
    matches = dry.describe_last(IDS)[0]
    # 9 follows "4 1 2 3" (4 tokens): 1 * 2 ** (4 - 2) = 4; 8 follows "2 3" (2 tokens): 1 * 2 ** 0 = 1
    assert [(m.token, m.length, m.start, m.exponent, m.penalty, m.repeat) for m in matches] == [
        (9, 4, 0, 2, 4.0, (4, 1, 2, 3)), (8, 2, 6, 0, 1.0, (2, 3))]
    scores = dry(IDS, torch.zeros(1, 10))
    assert scores[0, 9] == -4.0 and scores[0, 8] == -1.0  # what the step itself subtracted
    # a breaker (token 1) limits the repeat to the 2 tokens after it: 9 gets 2 ** 0, as 8
    broken = DRYLogitsProcessor(1.0, base=2.0, allowed_length=2, sequence_breakers=[[1]])
    assert [(m.token, m.length, m.penalty) for m in broken.describe_last(IDS)[0]] == [(8, 2, 1.0), (9, 2, 1.0)]
    assert broken(IDS, torch.zeros(1, 10))[0, 9] == -1.0


def test_xtc_says_its_coin_from_a_seeded_generator():
    coin = float(torch.rand(2, generator=torch.Generator().manual_seed(0))[0])  # 0.4963 < 0.5: fires in row 0
    second = float(torch.rand(2, generator=torch.Generator().manual_seed(0))[1])  # 0.7682 >= 0.5: not in row 1
    xtc = XTCLogitsWarper(threshold=0.15, probability=0.5, generator=torch.Generator().manual_seed(0))
    scores = torch.tensor([0.4, 0.3, 0.2, 0.1]).log().expand(2, 4)
    out = xtc(None, scores)
    first, other = xtc.describe_last()
    # p >= 0.15: tokens 0, 1, 2; all but the least likely (2) removed
    assert (first.coin, first.fired, first.top, first.removed) == (coin, True, [0, 1, 2], [0, 1])
    assert (other.coin, other.fired, other.removed) == (second, False, [])
    assert out[0].isinf().tolist() == [True, True, False, False] and torch.equal(out[1], scores[1])
    assert first.text() == f"coin {coin:.3f} < 0.5: fired; 3 tokens at p >= 0.15: removed #0, #1, kept #2"
    assert other.text() == f"coin {second:.3f} >= 0.5: did not fire"
    assert xtc.describe_last(torch.zeros(3, 1, dtype=torch.long)) == [None, None, None]  # another batch


def test_thinking_budget_says_it_forces_the_end_tag():
    budget = ThinkingBudgetLogitsProcessor(1, start_ids=[7], end_ids=[8, 9], message_ids=[5])
    assert budget.describe_last() == [None]
    ids = torch.tensor([[1, 7]])  # the prompt opens the span: counting, 1 token left
    budget(ids, torch.zeros(1, 10))
    assert budget.describe_last()[0].text() == "thinking: 1 of 1 tokens left"
    ids = torch.tensor([[1, 7, 3]])  # the one thinking token: spent, the message is forced, then the end tag
    budget(ids, torch.zeros(1, 10))
    assert budget.describe_last()[0].text() == "budget of 1 spent: forces #5 (message, token 1 of 1)"
    budget(torch.tensor([[1, 7, 3, 5]]), torch.zeros(1, 10))
    state = budget.describe_last()[0]
    assert (state.phase, state.forced, state.tokens) == ("forcing", 8, [8])
    assert state.text() == "budget of 1 spent: forces #8 (end tag, token 1 of 2)"


def test_explain_step_and_compare_step_show_why():
    logits = torch.zeros(1, 10)
    trace = explain_step(logits, IDS, dry_multiplier=1.0, dry_base=2.0, dry_sequence_breakers=[])
    assert trace.why(1) == ["#9 would extend the repeat #4 #1 #2 #3 (4 tokens, also at 0-3): -1*2^(4-2) = -4",
                            "#8 would extend the repeat #2 #3 (2 tokens, also at 6-7): -1*2^(2-2) = -1"]
    assert "why: #9 would extend" in str(trace) and "would extend the repeat" in trace._repr_html_()
    settings = {"plain": {}, "XTC": dict(xtc_threshold=0.15, xtc_probability=1.0),
                "budget": dict(thinking_budget=0, thinking_start=[7], thinking_end=[8])}
    ids = torch.tensor([[1, 7]])  # a span opened by the prompt, a budget of 0: the end tag is forced now
    result = compare_step(torch.tensor([[0.4, 0.3, 0.2, 0.1] + [1e-6] * 6]).log(), ids, settings,
                          generator=torch.Generator().manual_seed(0), do_sample=True, top_k=0)
    assert result.tokens["budget"].tolist() == [8]
    budget_stage = next(n for n, s in enumerate(result.traces["budget"].stages) if s.name.startswith("Thinking"))
    assert result.traces["budget"].why(budget_stage) == ["budget of 0 spent: forces #8 (end tag, token 1 of 1)"]
    xtc_stage = next(n for n, s in enumerate(result.traces["XTC"].stages) if s.name.startswith("XTC"))
    (why,) = result.traces["XTC"].why(xtc_stage)
    assert why.endswith("fired; 3 tokens at p >= 0.15: removed #0, #1, kept #2"), why  # probability 1: always
    text, html = str(result), result.to_html()
    assert "why: budget of 0 spent: forces #8" in text and "forces #8 (end tag" in html
    assert "removed #0, #1, kept #2" in html


def _letters():
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "b": 1, "c": 2, "d": 3},
                                                                               unk_token="a")))


def test_compare_generation_says_which_ban_rolled_back_which_steps():
    def model(ids):  # c > d > b > a at every position
        return torch.tensor([0.0, 1.0, 3.0, 2.0]).expand(ids.shape[0], ids.shape[1], 4)

    tok = _letters()
    settings = {"free": {}, "no 'c c'": dict(banned_strings=["c c"])}
    result = compare_generation(model, torch.tensor([[1]]), settings, max_new_tokens=3, tokenizer=tok)
    # free: c c c. Banned: c c -> back to step 0, c forbidden there -> d c c -> back to step 1 -> d d c
    assert result.tokens["free"].tolist() == [[1, 2, 2, 2]] and result.tokens["no 'c c'"].tolist() == [[1, 3, 3, 2]]
    assert [(r.position, r.taken, r.token, r.ban) for r in result.rollbacks["no 'c c'"]] == [(1, 2, 2, "c c"),
                                                                                          (2, 2, 2, "c c")]
    assert result.rollbacks["free"] == []
    assert result.rolled_back("no 'c c'") == [
        "steps 0-1 'c c' taken back: banned 'c c' matched 'c c'; 'c' forbidden at step 0",
        "steps 1-2 ' c c' taken back: banned 'c c' matched 'c c'; 'c' forbidden at step 1"]
    assert "rolled back: steps 0-1" in str(result) and "rolled back: " in result.to_html()


def _next_of(rule):
    """A model whose scores favour rule(last token) by 5 (all others 0), over 10 tokens."""
    def model(ids):
        logits = torch.zeros(ids.shape[0], ids.shape[1], 10)
        for row in range(ids.shape[0]):
            for column in range(ids.shape[1]):
                logits[row, column, rule(int(ids[row, column]))] = 5.0
        return logits
    return model


def test_compare_generation_says_dry_and_the_budget_where_the_settings_part():
    cycle = _next_of(lambda last: (last + 1) % 4)  # 0 1 2 3 0 1 ...
    settings = {"free": {}, "DRY": dict(dry_multiplier=4.0, dry_base=2.0, dry_sequence_breakers=[])}
    result = compare_generation(cycle, torch.tensor([[0, 1, 2, 3, 0, 1, 2]]), settings, max_new_tokens=1)
    # the ending "0 1 2" repeats the prompt's start: 3 would extend a 3-token repeat, -4 * 2 ** (3 - 2) = -8 -> 5 - 8 < 0,
    # so DRY's argmax is the first token at 0: #0
    assert result.tokens["free"][0, 7:].tolist() == [3] and result.tokens["DRY"][0, 7:].tolist() == [0]
    assert result.why("DRY") == ["#3 would extend the repeat #0 #1 #2 (3 tokens, also at 0-2): -4*2^(3-2) = -8"]
    assert result.why("free") == []
    assert "why: #3 would extend" in str(result) and "why: #3 would extend" in result.to_html()

    threes = _next_of(lambda last: 3)
    settings = {"free": {}, "budget 1": dict(thinking_budget=1, thinking_start=[7], thinking_end=[8])}
    result = compare_generation(threes, torch.tensor([[1, 7]]), settings, max_new_tokens=3)
    # the prompt opens the span; one thinking token (3), then the end tag is forced (8), then 3 again
    assert result.tokens["budget 1"].tolist() == [[1, 7, 3, 8, 3]] and result.first_difference == 1
    assert result.why("budget 1") == ["budget of 1 spent: forces #8 (end tag, token 1 of 1)"]


def test_dry_reasons_are_the_penalties_the_step_subtracts():
    # seeded random sequences over 5 tokens (many repeats), a two-token breaker, per-row values and windows;
    # the step's own subtraction (CPU path, and the batched device path run on the CPU) is each reason's penalty
    generator = torch.Generator().manual_seed(3)
    for trial in range(20):
        ids = torch.randint(0, 5, (3, 30), generator=generator)
        dry = DRYLogitsProcessor([0.5, 1.0, 2.0], base=[1.5, 2.0, 1.75], allowed_length=[1, 2, 3],
                                 penalty_last_n=[-1, 12, 25], sequence_breakers=[[4], [3, 2]])
        penalties = -dry(ids, torch.zeros(3, 5))
        with accelerator_route():
            assert torch.equal(-dry(ids, torch.zeros(3, 5)), penalties)
        for row, matches in enumerate(dry.describe_last(ids)):
            expected = torch.zeros(5)
            for match in matches:
                expected[match.token] = match.penalty
                tail = ids[row, ids.shape[1] - match.length:].tolist()
                assert ids[row, match.start: match.start + match.length].tolist() == tail == list(match.repeat)
                assert int(ids[row, match.start + match.length]) == match.token
            assert torch.allclose(penalties[row], expected), (trial, row)


def test_many_reasons_are_counted_after_the_first_six():
    ids = torch.tensor([[0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8, 0]])  # 0 was followed by 1..8: 8 penalised
    trace = explain_step(torch.zeros(1, 10), ids, dry_multiplier=1.0, dry_allowed_length=1, dry_sequence_breakers=[])
    assert len(trace.stages[1].reasons) == 8 and len(trace.why(1)) == 8
    shown = trace.why(1, most=6)
    assert shown[0] == "#1 would extend the repeat #0 (1 token, also at 0-0): -1*1.75^(1-1) = -1"  # ties: lower id
    assert shown[-1] == "+2 more" and len(shown) == 7
    assert str(trace).count("    why: ") == 7 and "+2 more" in trace._repr_html_()
