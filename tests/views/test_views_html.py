"""Every view's HTML, parsed back: token texts full of HTML metacharacters come out as the same text,
and no token can add an element or an attribute."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hfbridge import explain_generation, explain_step
from hfbridge._views.html import el

TAGS = {"wbr", "div", "span", "b", "br", "table", "thead", "tbody", "tr", "th", "td", "code", "details", "summary"}
ATTRIBUTES = {"style", "title", "class", "data-step"}
PAGE_TAGS = {"html", "head", "meta", "title", "style", "body"}
VOID = {"br", "meta", "wbr"}


class Parsed(HTMLParser):
    """Elements, attributes, the text of every `data-step` token and of the flowing-text box."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attributes: set[str] = set()
        self.titles: list[str] = []
        self.stack: list[dict] = []
        self.tokens: dict[int, str] = {}
        self.codes: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.tags.append(tag)
        self.attributes |= set(attributes)
        if "title" in attributes:
            self.titles.append(attributes["title"])
        if tag not in VOID:
            self.stack.append({"tag": tag, **attributes})

    def handle_endtag(self, tag):
        if tag not in VOID:
            assert self.stack and self.stack[-1]["tag"] == tag, f"</{tag}> closes {self.stack[-1:]}"
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)
        for element in reversed(self.stack):
            if "data-step" in element:
                step = int(element["data-step"])
                self.tokens[step] = self.tokens.get(step, "") + data
                break
        if self.stack and self.stack[-1]["tag"] == "code":
            self.codes.append(data)


def parse(page: str) -> Parsed:
    parsed = Parsed()
    parsed.feed(page)
    parsed.close()
    assert not parsed.stack
    return parsed


class Texts:
    """A tokenizer whose tokens are the given texts, decoded by plain concatenation."""

    eos_token_id = None
    pad_token_id = None
    all_special_ids: list[int] = []

    def __init__(self, texts):
        self.texts = texts

    def decode(self, ids):
        return "".join(self.texts[int(i)] for i in ids)


METACHARACTERS = "<>&\"'=/;`!-"
token_text = st.text(alphabet=METACHARACTERS + "ab é", min_size=1, max_size=8).filter(lambda t: t.strip() != "")


def _trace(texts, length=None):
    vocab = len(texts)
    steps = length or vocab
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (steps,), generator=generator)
    scores = tuple(torch.randn(1, vocab, generator=generator) for _ in range(steps))
    out = GenerateDecoderOnlyOutput(sequences=torch.cat([torch.tensor([0]), tokens])[None], scores=scores)
    return explain_generation(out, Texts(texts), top=3)


def _check_page(page: str, page_tags: bool = False) -> Parsed:
    parsed = parse(page)
    assert set(parsed.tags) <= TAGS | (PAGE_TAGS if page_tags else set())
    assert parsed.attributes <= ATTRIBUTES | ({"charset", "lang", "name", "content"} if page_tags else set())
    return parsed


@settings(max_examples=60, deadline=None)
@given(st.lists(token_text, min_size=2, max_size=6))
def test_generation_views_keep_every_token_as_text(texts):
    trace = _trace(texts)
    for page, whole in ((trace._repr_html_(), False), (trace.html(table="all"), False),
                        (trace.html(table="none"), False), (trace.to_html(), True)):
        parsed = _check_page(page, whole)
        generated = [step for step in trace.steps if not step.padding]
        # each token's highlighted text is the token (its leading spaces stand just before it)
        assert [parsed.tokens[step.step] for step in generated] == [step.text.lstrip() for step in generated]
        # the page's text holds the prompt and the generated text as they read
        assert trace.prompt_text + trace.text in "".join(parsed.text)
        for step in generated:  # tooltips: the token and its alternatives, as labels
            assert any(title.startswith(f"step {step.step}: {trace.token_label(step.token)}")
                       for title in parsed.titles)
    table = parse(trace.html(table="all"))
    labels = [trace.token_label(step.token) for step in trace.steps]
    assert all(label in table.codes for label in labels)


@settings(max_examples=60, deadline=None)
@given(st.lists(token_text, min_size=2, max_size=6))
def test_step_views_keep_every_token_as_text(texts):
    logits = torch.randn(len(texts), generator=torch.Generator().manual_seed(len(texts)))
    trace = explain_step(logits, tokenizer=Texts(texts), temperature=0.7, top_k=len(texts))
    for page, whole in ((trace._repr_html_(), False), (trace.to_html(), True)):
        parsed = _check_page(page, whole)
        for stage in trace.stages:  # every recorded token, as its label, in a <code>
            assert all(trace.token_label(token) in parsed.codes for token in stage.top_ids)
        assert f"explain_step: {trace.summary()}" in "".join(parsed.text)


@pytest.mark.parametrize("text", ["<script>alert(1)</script>", "' onmouseover='alert(1)", "&lt;b&gt;", "</span>",
                                  "\"><img src=x>", "<!--", "]]>"])
def test_padding_label_and_every_place_a_token_goes(text):
    """The '+ N padding' label (once unescaped), tooltips, the table and the title of a page."""
    texts = ["a", text, "b"]
    out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[0, 0, 1, 1], [0, 2, 2, 2]]),
                                    scores=tuple(torch.zeros(2, 3) for _ in range(3)))
    tokenizer = Texts(texts)
    tokenizer.eos_token_id = tokenizer.pad_token_id = 1
    trace = explain_generation(out, tokenizer)
    assert [step.padding for step in trace.steps] == [False, False, True]
    for page in (trace._repr_html_(), trace.to_html(), trace.html(table="all")):
        parsed = _check_page(page, page.startswith("<!DOCTYPE"))
        assert f"+ 1 × {trace.token_label(1)} padding: the row finished" in "".join(parsed.text)
    step = explain_step(torch.tensor([0.0, 5.0, 1.0]), tokenizer=tokenizer)
    parsed = _check_page(step.to_html(), True)
    assert trace.token_label(1) in parsed.codes


def test_whitespace_and_special_tokens_read_as_chips():
    texts = ["a", " ", "\n", "", " the"]
    out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[0, 1, 2, 3, 4]]),
                                    scores=tuple(torch.zeros(1, 5) for _ in range(4)))
    trace = explain_generation(out, Texts(texts))
    parsed = parse(trace._repr_html_())
    assert [parsed.tokens[s] for s in range(4)] == ["·", "↵", "''", "the"]
    assert "a" + " the" in "".join(parsed.text).replace("·", "").replace("↵\n", "").replace("''", "")


def test_builder_escapes_text_and_attributes_but_not_markup():
    inner = el("b", "<i>")
    assert el("span", inner, "<i>", title="'\"<>") == (
        "<span title='&#x27;&quot;&lt;&gt;'><b>&lt;i&gt;</b>&lt;i&gt;</span>")
    assert el("td", 3, None, data_step=2, hidden=None) == "<td data-step='2'>3</td>"
    with pytest.raises(ValueError, match="not an HTML tag name"):
        el("script><b", "x")


def test_long_trace_stays_small_and_lists_uncertain_steps():
    texts = [f"w{i} " for i in range(50)]
    trace = _trace(texts, length=2000)
    fragment = trace._repr_html_()
    everything = trace.html(table="all")
    assert len(fragment) < 0.6 * len(everything)
    parsed = _check_page(fragment)
    rows = fragment.split("<tbody>", 1)[1].count("<tr")
    assert 0 < rows <= 100
    assert "trace.html(table=&#x27;all&#x27;) lists every step" in fragment
    assert len(parsed.tokens) == 2000
    assert everything.split("<tbody>", 1)[1].count("<tr") == 2000
    with pytest.raises(ValueError, match=r"table: expected one of \['uncertain', 'all', 'none'\], got 'some'"):
        trace.html(table="some")


def test_long_trace_plot_draws_lines_not_bars():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    trace = _trace([f"w{i}" for i in range(30)], length=600)
    figure = trace.plot()
    top = figure.axes[0]
    assert not top.patches  # no bars
    assert any("mean over" in line.get_label() for line in top.get_lines())
    short = _trace([f"w{i}" for i in range(30)], length=20).plot()
    assert len(short.axes[0].patches) == 20
