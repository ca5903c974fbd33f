"""A new view is one module reading the trace records (`hfbridge/_views/step_record.py`'s `StepRecord`,
`hfbridge/_views/generation_record.py`'s `GenerationRecord`), plus its public name: nothing below the views changes.
The two views here are examples written for this test (Markdown tables, one of a step's stages, one of a
generation's tokens): each reads only its record, and shows `explain_step`'s and `explain_generation`'s output,
and a record built by hand, with no model, tokenizer or trace class behind it."""

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hfbridge import explain_generation, explain_step, generate
from hfbridge._views.generation_record import GenerationRecord, TokenStep
from hfbridge._views.step_record import StepRecord


def stages_markdown(record: StepRecord) -> str:
    """One line per stage of the step: its label, how many tokens it left, its best token and probability."""
    lines = ["| stage | left | best | p |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {stage.label} | {stage.possible} | {stage.top_ids[0]} | {stage.top_probs[0]:.3f} |"
              for stage in record.stages]
    return "\n".join(lines)


def tokens_markdown(record: GenerationRecord) -> str:
    """One line per generated token (padding left out): its label, probability and rank."""
    lines = ["| step | token | p | rank |", "| ---: | --- | ---: | ---: |"]
    lines += [f"| {step.step} | {record.token_label(step.token)} | {step.prob:.3f} | {step.rank} |"
              for step in record.generated]
    return "\n".join(lines)


def test_a_step_view_reads_explain_steps_record():
    trace = explain_step(torch.tensor([[0.0, 1.0, 3.0, -1.0]]), temperature=0.5, top_k=2, do_sample=True, row=0)
    assert stages_markdown(trace).splitlines() == [
        "| stage | left | best | p |", "| --- | ---: | ---: | ---: |",
        "| input | 4 | 2 | 0.831 |",
        "| TemperatureLogitsWarper(temperature=0.5) | 4 | 2 | 0.979 |",
        "| TopKLogitsWarper(top_k=2) | 2 | 2 | 0.982 |"]


def test_a_generation_view_reads_explain_generations_record():
    scores = (torch.tensor([[0.0, 2.0, float("-inf")]]), torch.tensor([[1.0, 1.0, 1.0]]))
    output = GenerateDecoderOnlyOutput(sequences=torch.tensor([[0, 1, 2]]), scores=scores)
    assert tokens_markdown(explain_generation(output)).splitlines()[2:] == ["| 0 | #1 | 0.881 | 1 |",
                                                                              "| 1 | #2 | 0.333 | 1 |"]
    table = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    output = generate(lambda ids: table[ids], torch.tensor([[1, 2]]), max_new_tokens=3,
                      return_dict_in_generate=True, output_scores=True)
    assert len(tokens_markdown(explain_generation(output)).splitlines()) == 2 + 3


def test_a_record_built_by_hand_is_all_a_view_needs():
    step = TokenStep(step=0, token=7, text=None, prob=0.25, logprob=-1.386, rank=2, alternatives=[], possible=5,
                     entropy=1.2)
    record = GenerationRecord(steps=[step], prompt_ids=[1], row=0, rows=1, beams=False, has_model=False)
    assert tokens_markdown(record).splitlines()[2:] == ["| 0 | #7 | 0.250 | 2 |"]
