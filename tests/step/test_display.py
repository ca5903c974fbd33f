"""Processors shown with their settings: `print(sampler.processors)`, `build_processors(...)`."""

import doctest

import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper

from hfbridge import Sampler, build_processors
from hfbridge._step.plan import processor_repr as _display
from hfbridge._step.plan.processor_repr import processor_label, processor_list_html, processor_list_repr


def test_each_processor_with_its_settings():
    processors = build_processors(repetition_penalty=1.2, no_repeat_ngram_size=3, bad_words_ids=[[3], [4, 5]],
                                  sequence_bias={(7,): 3.0}, suppress_tokens=[1, 2], eos_token_id=2,
                                  min_new_tokens=3, prompt_length=4, temperature=0.7, top_k=0, top_p=0.9, min_p=0.05)
    assert [processor_label(p) for p in processors] == [
        "SequenceBiasLogitsProcessor(sequence_bias={(7,): 3})",
        "RepetitionPenaltyLogitsProcessor(penalty=1.2)",
        "NoRepeatNGramLogitsProcessor(ngram_size=3)",
        "NoBadWordsLogitsProcessor(bad_words_ids=[[3], [4, 5]])",
        "MinLengthLogitsProcessor(min_length=7, eos_token_id=[2])",
        "MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=4, min_new_tokens=3, eos_token_id=[2])",
        "SuppressTokensLogitsProcessor(suppress_tokens=[1, 2])",
        "TemperatureLogitsWarper(temperature=0.7)",
        "TopPLogitsWarper(top_p=0.9, min_tokens_to_keep=1)",
        "MinPLogitsWarper(min_p=0.05, min_tokens_to_keep=1)",
    ]


def test_list_repr_one_processor_a_line():
    def shift(input_ids, scores):
        return scores + 1

    text = processor_list_repr([TemperatureLogitsWarper(0.5), shift], "Processors")
    assert text == (
        "Processors([\n"
        "    TemperatureLogitsWarper(temperature=0.5),\n"
        "    test_list_repr_one_processor_a_line.<locals>.shift,\n"
        "])"
    )
    assert processor_list_repr([], "Processors") == "Processors([])"


def test_html_escapes_and_numbers_in_order():
    class Odd:
        def __init__(self, tag="<b>"):
            self.tag = tag

        def __call__(self, input_ids, scores):
            return scores

    page = processor_list_html([TemperatureLogitsWarper(0.5), Odd()], "L")
    assert page.index("TemperatureLogitsWarper") < page.index("Odd")
    assert "<b>" not in page and "&#x27;&lt;b&gt;&#x27;" in page
    assert page.count("<li>") == 2


def test_state_and_large_tensors_are_not_shown():
    class Stateful:
        def __init__(self, table=None, scale=1.0):
            self.table = torch.zeros(100) if table is None else table  # vocabulary-sized: not a setting
            self.scale = scale
            self.calls = 0  # state, not a constructor argument

        def __call__(self, input_ids, scores):
            return scores

    # A class from outside transformers is named with its package (here the test module).
    assert processor_label(Stateful(scale=2.0)) == "test_display.Stateful(scale=2)"


def test_hf_classes_are_not_patched():
    processor = TemperatureLogitsWarper(0.5)
    assert "object at 0x" in repr(processor)
    assert "object at 0x" in repr(LogitsProcessorList([processor])).replace("\n", "")


@pytest.mark.parametrize("module", [_display])
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0


def test_printed_where_hfbridge_returns_processors():
    sampler = Sampler(temperature=0.7, top_k=0, repetition_penalty=1.3)
    expected = (
        "LogitsProcessorList([\n"
        "    RepetitionPenaltyLogitsProcessor(penalty=1.3),\n"
        "    TemperatureLogitsWarper(temperature=0.7),\n"
        "])"
    )
    assert isinstance(sampler.processors, LogitsProcessorList)  # still HF's list, for HF's code
    assert repr(sampler.processors) == str(sampler.processors) == expected
    assert repr(build_processors(temperature=0.7, top_k=0, repetition_penalty=1.3)) == expected
    assert "<ol" in sampler.processors._repr_html_()
    assert repr(build_processors()) == "LogitsProcessorList([])"
