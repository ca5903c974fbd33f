"""`explain_generation`: numbers against a hand computation and HF's transition scores; the displays."""

from __future__ import annotations

import html
import math
import re

import pytest
import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

import hfbridge
from hfbridge import explain_generation, generate

from _tiny_models import TinyCore, TinyRecompute, char_tokenizer, recompute_callable, tiny_gpt2

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf")

INF = float("inf")


def hand_output() -> GenerateDecoderOnlyOutput:
    """Two steps over a vocabulary of 4, batch of 1: prompt [3], then tokens 1 and 2."""
    scores = (
        torch.tensor([[0.0, math.log(3.0), -INF, -INF]]),  # after the processors: p = 1/4, 3/4, 0, 0
        torch.tensor([[math.log(2.0), 0.0, 0.0, -INF]]),  # p = 2/4, 1/4, 1/4, 0
    )
    logits = (
        torch.tensor([[0.0, 0.0, 0.0, math.log(5.0)]]),  # the model's own: p = 1/8, 1/8, 1/8, 5/8
        torch.tensor([[0.0, 0.0, math.log(2.0), 0.0]]),  # p = 1/5, 1/5, 2/5, 1/5
    )
    return GenerateDecoderOnlyOutput(sequences=torch.tensor([[3, 1, 2]]), scores=scores, logits=logits)


def test_hand_computed_tiny_vocabulary():
    trace = explain_generation(hand_output(), top=3)
    first, second = trace.steps
    assert (first.step, first.token, second.token) == (0, 1, 2)
    assert first.prob == pytest.approx(0.75) and first.logprob == pytest.approx(math.log(0.75))
    assert second.prob == pytest.approx(0.25) and second.logprob == pytest.approx(math.log(0.25))
    assert (first.rank, second.rank) == (1, 2)  # token 2 ties token 1 at 1/4; only token 0 is ahead
    assert (first.possible, second.possible) == (2, 3)
    assert first.entropy == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    assert second.entropy == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    # Removed tokens are no alternatives, even when `top` asks for more.
    assert [(a.token, round(a.prob, 6)) for a in first.alternatives] == [(1, 0.75), (0, 0.25)]
    assert second.alternatives[0].token == 0 and len(second.alternatives) == 3
    assert first.model_prob == pytest.approx(1 / 8) and second.model_prob == pytest.approx(2 / 5)
    assert first.model_entropy == pytest.approx(-(3 / 8 * math.log(1 / 8) + 5 / 8 * math.log(5 / 8)))
    assert first.alternatives[0].model_prob == pytest.approx(1 / 8)
    assert trace.prompt_ids == [3] and trace.has_model and not trace.beams
    assert [s.padding for s in trace.steps] == [False, False]
    assert first.text is None and trace.text is None


def test_without_logits_there_is_no_model_probability():
    out = hand_output()
    out.logits = None
    trace = explain_generation(out)
    assert not trace.has_model
    assert all(s.model_prob is None and s.model_entropy is None for s in trace.steps)
    assert "model" not in str(trace).split("\n")[1]


def test_output_is_not_modified():
    out = hand_output()
    before = [s.clone() for s in out.scores], [s.clone() for s in out.logits], out.sequences.clone()
    explain_generation(out, top=2)
    assert all(torch.equal(a, b) for a, b in zip(before[0], out.scores))
    assert all(torch.equal(a, b) for a, b in zip(before[1], out.logits))
    assert torch.equal(before[2], out.sequences)


def sampled_batch(eos: int = 5):
    """hfbridge.generate on a tiny HF model: 2 prompts, sampling with processors, rows that end at eos."""
    hf = tiny_gpt2()
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = generate(recompute_callable(hf), prompts, max_new_tokens=12, do_sample=True, temperature=0.9, top_k=6,
                   repetition_penalty=1.3, eos_token_id=eos, pad_token_id=0, return_dict_in_generate=True,
                   output_scores=True, output_logits=True, generator=torch.Generator().manual_seed(4))
    return hf, out


@pytest.mark.parametrize("eos", [5, 7])
def test_prob_is_exp_of_hf_transition_scores(eos):
    hf, out = sampled_batch(eos)
    expected = hf.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)  # [N, S]
    for row in range(out.sequences.shape[0]):
        trace = explain_generation(out, row=row, eos_token_id=eos)
        logprobs = torch.tensor([s.logprob for s in trace.steps])
        torch.testing.assert_close(logprobs, expected[row], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.tensor([s.prob for s in trace.steps]), expected[row].exp(),
                                   rtol=1e-5, atol=1e-7)
        raw = hf.compute_transition_scores(out.sequences, out.logits, normalize_logits=True)[row]
        torch.testing.assert_close(torch.tensor([s.model_prob for s in trace.steps]), raw.exp(), rtol=1e-5, atol=1e-7)


def test_padding_after_eos_is_marked():
    _, out = sampled_batch(5)
    new = out.sequences[:, 3:].tolist()
    finished = [row for row in range(2) if 5 in new[row][:-1]]
    assert finished, "the seed should give a row that ends before the other (else pick another seed)"
    for row in range(2):
        trace = explain_generation(out, row=row, eos_token_id=5)
        first_eos = new[row].index(5) if 5 in new[row] else len(new[row])
        assert set(new[row][first_eos + 1:]) <= {0}  # generate's filler
        assert [s.padding for s in trace.steps] == [t > first_eos for t in range(len(new[row]))]
        assert len(trace.generated) == min(first_eos + 1, len(new[row]))
    row = finished[0]
    trace = explain_generation(out, row=row, eos_token_id=5)
    assert "padding after the row finished" in trace._repr_html_() and "(padding: the row had finished)" in str(trace)
    # In the table, a padding token is grey: no choice was made there (its probability says nothing).
    rows = re.findall(r"<tr style='[^']*'>(.*?)</tr>", trace._repr_html_().split("<tbody>", 1)[1])
    for row_html, step in zip(rows, trace.steps):
        assert ("background:#e1e4e8" in row_html.split("</code>")[0]) == step.padding
    # Without knowing eos, nothing is called padding.
    assert not any(s.padding for s in explain_generation(out, row=row).steps)


def test_tokens_after_an_eos_that_did_not_stop_the_row_are_generated():
    scores = tuple(torch.zeros(1, 4) for _ in range(4))
    out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[1, 2, 3, 2, 1]]), scores=scores)
    assert [s.padding for s in explain_generation(out, eos_token_id=3).steps] == [False] * 4
    out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[1, 2, 3, 0, 0]]), scores=scores)
    assert [s.padding for s in explain_generation(out, eos_token_id=[3]).steps] == [False, False, True, True]


def test_pad_run_of_a_row_stopped_without_eos():
    hf = tiny_gpt2()
    out = generate(recompute_callable(hf), torch.tensor([[1, 2], [3, 4]]), max_new_tokens=10, do_sample=True,
                   stopping_criteria=[LengthOf(row=0, new=4)], eos_token_id=47, pad_token_id=9,
                   suppress_tokens=[9, 47], return_dict_in_generate=True,
                   output_scores=True, generator=torch.Generator().manual_seed(0))
    assert out.sequences[0, 6:].tolist() == [9] * 6 and 9 not in out.sequences[1, 2:].tolist()
    assert [s.padding for s in explain_generation(out, pad_token_id=9).steps] == [False] * 4 + [True] * 6
    assert not any(s.padding for s in explain_generation(out, row=1, pad_token_id=9).steps)
    assert not any(s.padding for s in explain_generation(out).steps)  # the filler is unknown


class LengthOf:
    """A stopping criterion, as a stop string is: row `row` is done after `new` tokens, without an eos.

    (Finished rows get the pad token only when some criterion knows an eos, as in HF.)
    """

    def __init__(self, row: int, new: int):
        self.row, self.new = row, new

    def __call__(self, input_ids, scores, **kwargs):
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        done[self.row] = input_ids.shape[1] - 2 >= self.new
        return done


def test_hf_model_generate_output():
    hf = tiny_gpt2()
    torch.manual_seed(1)
    out = hf.generate(torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 3, dtype=torch.long), do_sample=True,
                      top_p=0.8, max_new_tokens=8, return_dict_in_generate=True, output_scores=True,
                      output_logits=True, pad_token_id=0)
    trace = explain_generation(out, top=3)
    expected = hf.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)[0]
    torch.testing.assert_close(torch.tensor([s.prob for s in trace.steps]), expected.exp(), rtol=1e-5, atol=1e-7)
    assert [s.token for s in trace.steps] == out.sequences[0, 3:].tolist()
    assert all(s.possible < 48 for s in trace.steps)  # top-p removed tokens at every step
    assert all(s.model_prob is not None for s in trace.steps)


def test_hf_beam_search_output():
    hf = tiny_gpt2()
    out = hf.generate(torch.tensor([[1, 2, 3], [4, 5, 6]]), attention_mask=torch.ones(2, 3, dtype=torch.long),
                      num_beams=3, num_return_sequences=2, max_new_tokens=6, eos_token_id=7, pad_token_id=0,
                      do_sample=False, return_dict_in_generate=True, output_scores=True)
    expected = hf.compute_transition_scores(out.sequences, out.scores, out.beam_indices, normalize_logits=True)
    for row in range(out.sequences.shape[0]):
        trace = explain_generation(out, row=row)
        assert trace.beams and trace.rows == 4
        generated = [not s.padding for s in trace.steps]
        assert generated == (out.beam_indices[row, : len(trace.steps)] >= 0).tolist()
        got = torch.tensor([s.logprob if not s.padding else 0.0 for s in trace.steps])
        torch.testing.assert_close(got, expected[row], rtol=1e-5, atol=1e-6)
        assert all(s.beam is not None for s in trace.steps if not s.padding)


def tiny_char_generation(top: int = 4):
    tok = char_tokenizer()
    model = TinyRecompute(TinyCore(vocab=len(tok), seed=3))
    prompt = tok("the cat", return_tensors="pt").input_ids
    out = generate(model, prompt, max_new_tokens=15, do_sample=True, temperature=1.5, top_k=8, suppress_tokens=[0, 1],
                   return_dict_in_generate=True, output_scores=True, output_logits=True,
                   generator=torch.Generator().manual_seed(0))
    return tok, out, explain_generation(out, tok, top=top)


def test_text_of_steps_is_the_generated_text():
    tok, out, trace = tiny_char_generation()
    assert trace.prompt_text == "the cat"
    assert trace.text == tok.decode(out.sequences[0, 7:])
    assert [s.text for s in trace.steps] == [tok.decode([t]) for t in out.sequences[0, 7:].tolist()]


def test_html_holds_every_token_and_its_alternatives():
    _, _, trace = tiny_char_generation(top=4)
    fragment = trace.html(table="all")
    spans = re.findall(r"<span data-step='(\d+)' title='([^']*)' style='[^']*'>([^<]*)</span>", fragment)
    assert [int(step) for step, _, _ in spans] == list(range(len(trace.steps)))
    # the highlight leaves out a token's leading space; a space alone shows as a chip "·"
    assert [html.unescape(text) for _, _, text in spans] == [s.text.lstrip() or s.text.replace(" ", "·")
                                                             for s in trace.steps]
    for (_, tooltip, _), step in zip(spans, trace.steps):
        tooltip = html.unescape(tooltip)
        assert f"p = {step.prob:.3f}" in tooltip and f"model's own p = {step.model_prob:.3f}" in tooltip
        for alternative in step.alternatives:
            assert f"{trace.token_label(alternative.token)}  {alternative.prob:.3f}" in tooltip
    # The expandable table: one row per step, each with all its alternatives.
    table = fragment.split("<details", 1)[1]
    rows = re.findall(r"<tr style='[^']*'>(.*?)</tr>", table.split("<tbody>", 1)[1])
    assert len(rows) == len(trace.steps)
    for row_html, step in zip(rows, trace.steps):
        labels = [html.unescape(x) for x in re.findall(r"<code[^>]*>([^<]*)</code>", row_html)]
        assert labels == [trace.token_label(step.token)] + [trace.token_label(a.token) for a in step.alternatives]
    assert "<style" not in fragment  # Jupyter front ends keep inline styles only
    assert "font-family" in fragment.split(">", 1)[0]


def test_html_escapes_token_text():
    out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[0, 1, 2]]), scores=(torch.zeros(1, 4), torch.zeros(1, 4)))

    class Tok:
        eos_token_id = None

        def decode(self, ids):
            return "".join({0: "x", 1: "<b>", 2: "'&", 3: "y"}[i] for i in ids)

    fragment = explain_generation(out, Tok())._repr_html_()
    assert "<b>" not in fragment and "&lt;b&gt;" in fragment and "&#x27;&amp;" in fragment


def test_standalone_page_carries_its_own_styles():
    _, _, trace = tiny_char_generation()
    page = trace.to_html()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    style = page.split("<style>", 1)[1].split("</style>", 1)[0]
    assert "font-family" in style and "sans-serif" in style and "table" in style
    assert "<link" not in page and "http" not in page.split("<body>")[0]  # nothing fetched from elsewhere
    assert trace._repr_html_() in page
    step = hfbridge.explain_step(torch.tensor([0.0, 1.0, 2.0]), top_k=2)
    step_page = step.to_html()
    assert "font-family" in step_page.split("<style>", 1)[1] and step._repr_html_() in step_page
    # The serif fallback outside Jupyter is gone: the fragment's root element names its font.
    fragment = step._repr_html_()
    assert fragment.split(">", 1)[0].startswith("<div class='hfbridge-step' style='font-family:")


def test_text_table():
    _, _, trace = tiny_char_generation()
    text = str(trace)
    lines = text.splitlines()
    assert lines[0].startswith("explain_generation: row 0 of 1, 15 generated tokens")
    assert lines[1] == "prompt: 'the cat'" and lines[2] == f"text:   {trace.text!r}"
    step_lines = [line for line in lines if re.match(r"^\s+\d+\s", line)]
    assert len(step_lines) == 15
    for line, step in zip(step_lines, trace.steps):
        assert trace.token_label(step.token) in line and f"{step.prob:5.3f}" in line
        assert f"[{step.model_prob:5.3f}]" in line


def test_plot_returns_a_figure():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    _, _, trace = tiny_char_generation()
    fig = trace.plot()
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    bars = fig.axes[0].patches
    assert [round(b.get_height(), 6) for b in bars] == [round(s.prob, 6) for s in trace.steps]
    import matplotlib.pyplot as plt

    _, axes = plt.subplots(2, 1)
    assert trace.plot(ax=axes) is axes[0].figure
    plt.close("all")


def test_empty_generation_and_ids_without_tokenizer():
    out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[2, 1]]), scores=())
    trace = explain_generation(out)
    assert trace.steps == [] and trace.prompt_ids == [2, 1]
    assert "0 generated tokens" in str(trace) and "The uncertain steps: 0 of 0" in trace._repr_html_()
    assert "0 steps" in trace.html(table="all")


@pytest.mark.parametrize(
    ("make", "kwargs", "error", "message"),
    [
        (lambda: torch.tensor([[1, 2]]), {}, TypeError,
         "needs the output of generate(..., return_dict_in_generate=True, output_scores=True); got a tensor of shape"),
        (lambda: GenerateDecoderOnlyOutput(sequences=torch.tensor([[1, 2]]), logits=(torch.zeros(1, 3),)), {},
         ValueError, "output.scores is None: pass output_scores=True"),
        (hand_output, {"row": 1}, ValueError, "row: got 1, expected 0 <= row < 1"),
        (hand_output, {"row": True}, TypeError, "row: expected an int"),
        (hand_output, {"top": 0}, ValueError, "top: expected a positive int"),
        (hand_output, {"eos_token_id": "x"}, TypeError, "eos_token_id: expected an int or a list of ints"),
        (lambda: GenerateDecoderOnlyOutput(sequences=torch.tensor([[1, 2]]), scores=(torch.zeros(3, 4),)), {},
         ValueError, "output.scores have 3 rows per step but output.sequences has 1; a beam search output needs"),
        (lambda: GenerateDecoderOnlyOutput(sequences=torch.tensor([[1, 7]]), scores=(torch.zeros(1, 4),)), {},
         ValueError, "holds token id 7, but the scores have 4 vocabulary columns"),
        (lambda: GenerateDecoderOnlyOutput(sequences=torch.tensor([[1, 2]]),
                                           scores=(torch.tensor([[0.0, float("nan"), 0.0]]),)), {},
         ValueError, "output.scores at step 0 holds NaN or +inf"),
    ],
)
def test_errors(make, kwargs, error, message):
    with pytest.raises(error) as info:
        explain_generation(make(), **kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("do_sample", [False, True])
def test_hfbridge_beam_search_output(do_sample):
    hf = tiny_gpt2()
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    torch.manual_seed(2)
    out = generate(recompute_callable(hf), prompts, num_beams=3, num_return_sequences=2, max_new_tokens=6,
                   do_sample=do_sample, eos_token_id=7, pad_token_id=0, return_dict_in_generate=True,
                   output_scores=True, output_logits=True)
    expected = hfbridge.compute_transition_scores(out.sequences, out.scores, out.beam_indices, normalize_logits=True)
    raw = hfbridge.compute_transition_scores(out.sequences, out.logits, out.beam_indices, normalize_logits=True)
    for row in range(out.sequences.shape[0]):
        trace = explain_generation(out, row=row)
        assert trace.beams and trace.has_model
        mask = [not s.padding for s in trace.steps]
        assert mask == (out.beam_indices[row, : len(trace.steps)] >= 0).tolist()
        got = torch.tensor([s.logprob if not s.padding else 0.0 for s in trace.steps])
        torch.testing.assert_close(got, expected[row], rtol=1e-5, atol=1e-6)
        model = torch.tensor([s.model_prob if not s.padding else 1.0 for s in trace.steps])
        torch.testing.assert_close(model.log(), raw[row], rtol=1e-5, atol=1e-6)
