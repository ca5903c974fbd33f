"""`reads_ids`: which processors never read the token ids (HF's warpers, by their registry rows; ours, by the
class trait), checked against each class's own source on the installed transformers, so an engine may skip
building the histories for a chain of them (`vllm/_requests.py`, `sglang/_calls.py`)."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper
from transformers.generation import logits_process

import hfbridge.processors as processors
from hfbridge._step.checks.caller_inputs import reads_ids
from hfbridge._step.plan.option_table import ROWS, idless_processors
from hfbridge.processors import DRYLogitsProcessor, TopNSigmaLogitsWarper, XTCLogitsWarper
from hfbridge.processors._traits import own_trait


def _names_ids(kind: type) -> bool:
    """Whether `kind.__call__`'s body names `input_ids` (the parameter itself aside)."""
    function = ast.parse(textwrap.dedent(inspect.getsource(kind.__call__))).body[0]
    return any(isinstance(node, ast.Name) and node.id == "input_ids"
               for statement in function.body for node in ast.walk(statement))


HF_IDLESS = sorted(name for name in idless_processors() if hasattr(logits_process, name))
OURS = [getattr(processors, name) for name in processors.__all__
        if isinstance(getattr(processors, name), type) and name.endswith(("Warper", "Processor"))]


@pytest.mark.parametrize("name", HF_IDLESS)
def test_hf_classes_the_rows_mark_never_read_the_ids(name):
    assert not _names_ids(getattr(logits_process, name))


def test_the_rows_mark_hfs_warpers_and_nothing_else():
    assert set(HF_IDLESS) >= {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
                              "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper"}
    readers = {row.processor for row in ROWS.values() if row.reads_ids and isinstance(row.processor, str)}
    assert readers == {"RepetitionPenaltyLogitsProcessor", "NoRepeatNGramLogitsProcessor"}
    assert all(_names_ids(getattr(logits_process, name)) for name in readers)


@pytest.mark.parametrize("kind", OURS, ids=lambda kind: kind.__name__)
def test_our_trait_matches_the_source(kind):
    declared = own_trait(kind, "reads_ids")
    assert declared in (None, False)  # absent: reads them
    assert (declared is False) == (not _names_ids(kind))


def test_a_chain_reads_the_ids_if_any_member_may():
    xtc = XTCLogitsWarper(threshold=0.1, probability=0.5)
    assert not reads_ids([TopKLogitsWarper(5), TemperatureLogitsWarper(0.7), TopNSigmaLogitsWarper(1.0), xtc])
    assert not reads_ids([])
    assert reads_ids([xtc, RepetitionPenaltyLogitsProcessor(1.2)])
    assert reads_ids([xtc, DRYLogitsProcessor(0.8, sequence_breakers=[[3]])])
    assert reads_ids([lambda ids, scores: scores])  # a user's callable: it may

    class MyXTC(XTCLogitsWarper):  # a subclass may read them: the trait is not inherited
        def __call__(self, input_ids, scores):
            return super().__call__(input_ids, scores[:, :] + input_ids.shape[1] * 0)

    assert reads_ids([MyXTC(threshold=0.1, probability=0.5)])
    assert reads_ids([torch.nn.Identity()])
