"""The option lists of `sample_step`, `Sampler`, `generate` and `explain_step` are written from the registry."""

from __future__ import annotations

import inspect
import re

import pytest

import hfbridge
from hfbridge._step.plan.option_docs import MARKER, fill_options, option_lines
from hfbridge._step.plan.option_table import ROWS, OptionRow, register, unregister
from hfbridge.processors import TopNSigmaLogitsWarper

PUBLIC = [hfbridge.sample_step, hfbridge.Sampler, hfbridge.generate, hfbridge.explain_step]


@pytest.mark.parametrize("obj", PUBLIC, ids=lambda obj: obj.__name__)
def test_every_registry_option_is_in_the_docstring(obj):
    doc = inspect.getdoc(obj)
    assert MARKER not in doc
    listed = re.findall(r"`(\w+)`", doc[doc.index("Every option of the registry"):])
    assert set(ROWS) <= set(listed), sorted(set(ROWS) - set(listed))
    for name in ("thinking_budget", "sampler_order", "adaptive_target", "mirostat_m"):  # the newest ones
        assert f"`{name}`" in doc


def test_the_list_says_per_row_off_and_default_values():
    lines = "\n".join(option_lines())
    assert "- `TopKLogitsWarper` (HF): `top_k`* (off 0)." in lines
    assert "`mirostat` (off 0), `mirostat_tau`* (default 5.0)" in lines  # mirostat takes one value for the batch
    assert "`adaptive_target`* (off below 0, default -1.0)" in lines
    assert "- the chain's order: `sampler_order`." in lines
    assert all(len(line) <= 100 for line in lines.splitlines())


def test_a_registered_option_is_listed():
    register(OptionRow("top_n_sigma_test", TopNSigmaLogitsWarper, argument="n", default=2.0, place="last"))
    try:
        assert "`top_n_sigma_test`* (default 2.0)" in "\n".join(option_lines())
    finally:
        unregister("top_n_sigma_test")
    assert "top_n_sigma_test" not in "\n".join(option_lines())


def test_fill_options_keeps_the_indentation_and_leaves_other_docstrings():
    doc = "Run.\n\n    Args:\n        x: The options.\n            [registry options]\n        y: Why.\n"
    filled = fill_options(doc)
    lines = filled.splitlines()
    assert lines[:4] == doc.splitlines()[:4] and lines[-1] == "        y: Why." and filled.endswith("\n")
    body = lines[4:-1]
    assert body[0].startswith("            Every option of the registry") and "" in body
    assert all(line.startswith("            ") for line in body if line)
    assert fill_options("No list here.") == "No list here." and fill_options(None) is None
