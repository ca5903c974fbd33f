"""explain_step: every recorded number against HF's processors run by hand; rendering; the chosen token."""

from __future__ import annotations

import math
import re
import sys

import pytest
import torch
from transformers import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hfbridge import StepTrace, explain_step, sample_step

# A 5-token vocabulary: small enough to check by hand.
LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])  # [B=1, V=5]
INPUT_IDS = torch.tensor([[0, 3]])  # tokens 0 and 3 were already used
OPTIONS = dict(repetition_penalty=1.5, temperature=0.5, top_k=3, top_p=0.8)


class CharTokenizer:
    """Just enough of a tokenizer for display: token i is the letter 'a' + i."""

    def decode(self, ids):
        return "".join(chr(ord("a") + int(i)) for i in ids)


def _hand_stages():
    """The same step computed directly with HF's processor classes, in HF's order."""
    scores = LOGITS.clone()
    out = [("input", scores.clone())]
    for processor in (
        RepetitionPenaltyLogitsProcessor(1.5),
        TemperatureLogitsWarper(0.5),
        TopKLogitsWarper(3),
        TopPLogitsWarper(0.8),
    ):
        scores = processor(INPUT_IDS, scores.clone())
        out.append((type(processor).__name__, scores.clone()))
    return out


def test_stages_equal_hf_processors_run_by_hand():
    trace = explain_step(LOGITS, INPUT_IDS, top=5, generator=torch.Generator().manual_seed(0), **OPTIONS)
    hand = _hand_stages()
    assert [s.name for s in trace.stages] == [name for name, _ in hand]
    for stage, (_, scores) in zip(trace.stages, hand):
        assert torch.equal(stage.scores, scores[0])
        probs = torch.softmax(scores[0], dim=-1)
        finite = scores[0] > float("-inf")
        order = [i for i in torch.argsort(scores[0], descending=True, stable=True).tolist() if finite[i]]
        assert stage.top_ids == order
        assert stage.top_probs == pytest.approx(probs[order].tolist())
        assert stage.possible == int(finite.sum())
        p = probs[probs > 0]
        assert stage.entropy == pytest.approx(float(-(p * p.log()).sum()), abs=1e-6)


def test_numbers_by_arithmetic():
    trace = explain_step(LOGITS, INPUT_IDS, generator=torch.Generator().manual_seed(0), **OPTIONS)
    penalty, temperature, top_k, top_p = trace.stages[1:]
    # Used tokens: a positive score is divided by the penalty, a negative one multiplied.
    assert penalty.scores.tolist() == pytest.approx([2.0 / 1.5, 1.0, 0.5, -1.5, 0.0])
    assert penalty.params["penalty"] == 1.5
    assert temperature.scores.tolist() == pytest.approx([4.0 / 1.5, 2.0, 1.0, -3.0, 0.0])
    assert temperature.params == {"temperature": 0.5}
    assert top_k.possible == 3 and top_k.top_ids == [0, 1, 2]
    # After top-k: softmax of [8/3, 2, 1] -> 0.586, 0.301, 0.111; top-p 0.8 keeps the first two.
    e = [math.exp(4.0 / 1.5), math.exp(2.0), math.exp(1.0)]
    assert top_k.top_probs == pytest.approx([x / sum(e) for x in e])
    assert top_p.possible == 2 and top_p.top_ids == [0, 1]
    assert top_p.top_probs == pytest.approx([e[0] / (e[0] + e[1]), e[1] / (e[0] + e[1])])
    assert trace.stages[0].params == {} and trace.stages[0].possible == 5


@pytest.mark.parametrize("seed", range(6))
def test_chosen_token_is_sample_steps(seed):
    logits = torch.randn(3, 4, 40, generator=torch.Generator().manual_seed(seed))  # [B, T, V]
    input_ids = torch.randint(0, 40, (3, 6), generator=torch.Generator().manual_seed(seed + 100))
    options = dict(temperature=1.3, top_p=0.9, repetition_penalty=1.2)
    expected = sample_step(logits, input_ids, generator=torch.Generator().manual_seed(seed), **options)
    for row in range(3):
        trace = explain_step(logits, input_ids, row=row, generator=torch.Generator().manual_seed(seed), **options)
        assert trace.token == int(expected[row])
        assert trace.do_sample and trace.row == row and trace.batch_rows == 3
        assert torch.isfinite(trace.stages[-1].scores[trace.token])


def test_greedy_layout_and_padded_vocab():
    logits = torch.randn(5, 2, 64, generator=torch.Generator().manual_seed(1))  # [T, B, V padded]
    logits[-1, 1, 60] = 100.0  # a padded column must never win
    input_ids = torch.tensor([[1, 2], [3, 4]])
    trace = explain_step(logits, input_ids, layout="t b v", vocab_size=50, row=1, repetition_penalty=2.0)
    expected = sample_step(logits, input_ids, layout="t b v", vocab_size=50, repetition_penalty=2.0)
    assert not trace.do_sample
    assert trace.token == int(expected[1])
    assert trace.stages[0].scores.shape == (50,)
    assert trace.token == int(torch.argmax(trace.stages[-1].scores))


def test_callers_tensors_untouched():
    logits = torch.randn(2, 3, 11, dtype=torch.bfloat16)
    input_ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    before, before_ids = logits.clone(), input_ids.clone()
    explain_step(logits, input_ids, repetition_penalty=1.5, top_k=4, temperature=0.7)
    assert torch.equal(logits, before) and torch.equal(input_ids, before_ids)


def test_top_limits_and_removed_tokens_not_listed():
    trace = explain_step(LOGITS, top=2, top_k=3, do_sample=True)
    assert all(len(s.top_ids) == 2 for s in trace.stages)
    trace = explain_step(LOGITS, top=10, top_k=3, do_sample=True)
    assert len(trace.stages[0].top_ids) == 5 and len(trace.stages[-1].top_ids) == 3


@pytest.mark.parametrize("row", [1, -1, 5])
def test_row_out_of_range(row):
    with pytest.raises(ValueError, match=r"row: got .*expected 0 <= row < 1"):
        explain_step(LOGITS, row=row)


@pytest.mark.parametrize("top", [0, -3, 2.5, True])
def test_bad_top(top):
    with pytest.raises(ValueError, match="top"):
        explain_step(LOGITS, top=top)


def test_option_errors_are_the_steps():
    with pytest.raises(TypeError, match="temprature"):
        explain_step(LOGITS, temprature=0.5)


def test_text_and_html_name_processors_and_chosen_token():
    trace = explain_step(
        LOGITS, INPUT_IDS, tokenizer=CharTokenizer(), generator=torch.Generator().manual_seed(0), **OPTIONS
    )
    text, page = str(trace), trace._repr_html_()
    assert repr(trace) == text
    chosen = CharTokenizer().decode([trace.token])
    for name in ("RepetitionPenaltyLogitsProcessor", "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"):
        assert name in text
        assert name.replace("LogitsProcessor", "").replace("LogitsWarper", "") in page.replace("<wbr>", "")
    assert f"token {trace.token} {chosen!r}" in text and "<- chosen" in text
    assert f"token {trace.token} {chosen!r}".replace("'", "&#x27;") in page
    assert "penalty=1.5" in text and "top_p=0.8" in page
    assert page.startswith("<div class='hfbridge-step'") and page.endswith("</table></div>")
    assert page.count("<tr") == 1 + 5 + 3  # header, ranks, possible / entropy / changed


def test_text_without_tokenizer_shows_ids():
    trace = explain_step(LOGITS)
    assert trace.token == 0 and "#0" in str(trace) and "greedily" in str(trace)


def test_html_escapes_token_text():
    class Angle:
        def decode(self, ids):
            return "<b>&"

    page = explain_step(LOGITS, tokenizer=Angle())._repr_html_()
    assert "<b>&" not in page and "&lt;b&gt;&amp;" in page


def test_plot_returns_figure():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    trace = explain_step(LOGITS, INPUT_IDS, tokenizer=CharTokenizer(), **OPTIONS)
    fig = trace.plot()
    assert isinstance(fig, Figure)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("(chosen)" in label for label in labels)
    # Each bar of stacked segments adds up to one (every stage is a distribution).
    heights = {}
    for patch in fig.axes[0].patches:
        x = round(patch.get_x(), 3)
        heights[x] = heights.get(x, 0.0) + patch.get_height()
    assert len(heights) == len(trace.stages)
    assert all(h == pytest.approx(1.0, abs=1e-5) for h in heights.values())


def test_plot_into_given_axes():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        assert explain_step(LOGITS, temperature=2.0).plot(ax=ax, top=2) is fig
    finally:
        plt.close(fig)


def test_plot_without_matplotlib_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    message = "install it with `pip install matplotlib` (or, in a clone of hfbridge, `pip install -e \".[notebooks]\"`)."
    with pytest.raises(ImportError, match=re.escape(message)):
        explain_step(LOGITS).plot()


def test_trace_type():
    assert isinstance(explain_step(LOGITS[0]), StepTrace)


class AddBias:
    """A user's processor (not from transformers) that counts its calls."""

    def __init__(self, token, bias):
        self.token, self.bias, self.calls, self._cache = token, bias, 0, object()

    def __call__(self, input_ids, scores):
        self.calls += 1
        scores[:, self.token] += self.bias
        return scores


def test_user_processor_runs_once_and_shows_its_settings():
    processor = AddBias(token=4, bias=5.0)
    trace = explain_step(LOGITS, processors=[processor], temperature=0.5, generator=torch.Generator().manual_seed(0))
    assert processor.calls == 1  # a stateful processor must see the step once
    names = [s.name for s in trace.stages]
    assert names[0] == "input" and names[1].endswith("AddBias") and "." in names[1]
    assert trace.stages[1].params == {"token": 4, "bias": 5.0}  # constructor settings, not state
    assert trace.stages[1].scores.tolist() == pytest.approx([2.0, 1.0, 0.5, -1.0, 5.0])
    assert trace.stages[-1].top_ids[0] == 4


def test_docstring_examples():
    pytest.importorskip("matplotlib")
    import doctest

    import hfbridge._views.explain_step

    failures, tried = doctest.testmod(hfbridge._views.explain_step, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0


def test_fast_path_choice_is_sample_steps():
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(3))  # [B, V]
    options = dict(temperature=0.9, top_k=40, top_p=0.9, fast=True)
    expected = sample_step(logits, generator=torch.Generator().manual_seed(1), **options)
    trace = explain_step(logits, row=2, generator=torch.Generator().manual_seed(1), **options)
    assert trace.token == int(expected[2])
    assert torch.isfinite(trace.stages[-1].scores[trace.token])


def test_processors_that_remove_everything_are_the_steps_error():
    with pytest.raises(ValueError, match="row 0"):
        explain_step(LOGITS, suppress_tokens=[0, 1, 2, 3, 4])


def test_headers_name_our_samplers_as_briefly_as_hfs():
    """hfbridge's samplers are named like HF's processors: no package, the suffix dropped in the header,
    a line break possible between the words of a long name, so that headers never overlap."""
    trace = explain_step(torch.randn(1, 40), torch.randint(0, 40, (1, 12)), dynatemp_range=0.5, temperature=0.9,
                         presence_penalty=0.5, penalty_last_n=-1, top_k=0)
    assert [stage.name for stage in trace.stages] == ["input", "PresenceFrequencyPenaltyLogitsProcessor",
                                                      "DynamicTemperatureLogitsWarper"]
    page = trace._repr_html_()
    assert "[1] <wbr>Presence<wbr>Frequency<wbr>Penalty<br>" in page
    assert "[2] <wbr>Dynamic<wbr>Temperature<br>" in page
    assert "hfbridge." not in page and "hfbridge." not in str(trace)
    assert "overflow-wrap:anywhere" in page  # a long parameter value wraps inside its column


def test_token_chips_keep_their_own_colours():
    """A notebook's `code` style (JupyterLab dark: a dark grey background, light text) stays outside the card."""
    trace = explain_step(torch.tensor([[0.0, 1.0, 2.0]]), tokenizer=CharTokenizer())
    chips = re.findall(r"<code style='([^']*)'>", trace._repr_html_())
    assert chips and all("background:transparent;color:inherit;padding:0;border:0" in chip for chip in chips)


def test_changed_says_why_a_stage_looks_the_same():
    """By hand: the penalty divides token 3's score (1.0 -> 0.5), top_k=3 removes tokens 3 and 4; with the
    top 2 shown, neither change is visible, and the trace says so."""
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    trace = explain_step(logits, torch.tensor([[3, 3]]), top=2, repetition_penalty=2.0, top_k=3)
    assert [stage.name for stage in trace.stages] == ["input", "RepetitionPenaltyLogitsProcessor", "TopKLogitsWarper"]
    assert [stage.changed for stage in trace.stages] == [None, 1, 2]
    assert [trace.changed_text(n) for n in range(3)] == ["", "changed 1 score (none shown)",
                                                          "changed 2 scores (none shown)"]
    assert "changed 1 score (none shown)" in str(trace)
    assert ">1 score (none shown)</td>" in trace._repr_html_()
    unchanged = explain_step(logits, torch.tensor([[4]]), repetition_penalty=2.0)  # 0.0 / 2 is still 0.0
    assert unchanged.changed_text(1) == "changed no score"
