"""`python -m hfbridge doctor`: exit status 0 when hfbridge gives transformers' tokens, 1 naming what does not."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import torch
import transformers

import hfbridge
from hfbridge.demo import doctor
from hfbridge.demo.doctor import FORMS, STRATEGIES, Check, run_check, run_doctor

REPO = Path(__file__).resolve().parents[1]
ROWS = [(strategy, model) for strategy in STRATEGIES for model in ("gpt2", "llama")]


def _rows(output: str) -> dict[tuple[str, str], list[str]]:
    """The table's cells by (strategy, model), in the order of FORMS."""
    found = {}
    for strategy, model in ROWS:
        match = re.search(rf"^{re.escape(strategy)}\s+{model}\s+(\S+)\s+(\S+)\s+(\S+)$", output, re.MULTILINE)
        assert match, f"no row for {strategy} / {model} in:\n{output}"
        found[(strategy, model)] = list(match.groups())
    return found


def test_passes_on_the_installed_versions():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "hfbridge", "doctor"], capture_output=True, text=True, env=env,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first == (f"hfbridge doctor: Python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
                     f"{transformers.__version__}, hfbridge {hfbridge.__version__}")
    assert re.search(r"^strategy\s+model\s+plain callable\s+ReturnsCache\s+PreTrainedModel$", done.stdout, re.MULTILINE)
    assert all(cells == ["ok"] * 3 for cells in _rows(done.stdout).values())
    assert re.search(r"^all 36 checks passed \(\d+\.\ds\)\.$", done.stdout, re.MULTILINE)


def test_a_mismatch_and_an_exception_fail_by_name(monkeypatch):
    import hfbridge._generate.loop as loop
    from hfbridge._models.hf_model import HFModel

    def worst(view):  # hfbridge's greedy choice made wrong: the lowest score instead of the highest
        best = view.min(dim=-1)
        return best.indices, view.max(dim=-1).values

    def broken(self, input_ids, state):
        raise RuntimeError("boom")

    monkeypatch.setattr(loop, "greedy_choice", worst)
    monkeypatch.setattr(HFModel, "forward", broken)
    out = io.StringIO()
    assert run_doctor(out) == 1
    text = out.getvalue()
    rows = _rows(text)
    assert rows[("greedy", "gpt2")] == ["MISMATCH", "MISMATCH", "ERROR"]
    assert rows[("beam search", "llama")][2] == "ERROR"  # every call of the PreTrainedModel form raises
    assert re.search(r"^MISMATCH  greedy / gpt2 / plain callable: row 0 differs from position 6: transformers \d+, "
                     r"hfbridge \d+$", text, re.MULTILINE)
    assert re.search(r"^ERROR  sampling / llama / PreTrainedModel: hfbridge raised RuntimeError: boom \(at broken, "
                     r"test_doctor.py:\d+\)$", text, re.MULTILINE)
    failed = sum(cells.count("MISMATCH") + cells.count("ERROR") for cells in rows.values())
    assert f"\n{failed} of 36 checks FAILED (" in text


def test_run_check_statuses():
    ok = run_check(Check("greedy", "gpt2", FORMS[0]), lambda: torch.tensor([[1, 2]]), lambda: torch.tensor([[1, 2]]))
    assert (ok.status, ok.detail) == ("ok", "")
    short = run_check(Check("greedy", "gpt2", FORMS[0]), lambda: torch.tensor([[1, 2]]),
                      lambda: torch.tensor([[1, 2, 3]]))
    assert (short.status, short.detail) == ("MISMATCH", "shape (1, 2), transformers (1, 3)")

    def fails():
        raise ValueError("no\nsecond line")

    theirs_failed = run_check(Check("greedy", "gpt2", FORMS[0]), lambda: torch.tensor([[1]]), fails)
    assert theirs_failed.status == "n/a"
    assert theirs_failed.detail.startswith("transformers' own generate raised ValueError: no (at fails, ")


def test_checks_cover_every_strategy_and_form():
    assert list(STRATEGIES) == ["greedy", "sampling", "beam search", "beam sampling", "assisted", "prompt lookup"]
    assert FORMS == ("plain callable", "ReturnsCache", "PreTrainedModel")
    assert doctor.table([Check("greedy", "gpt2", form, "ok") for form in FORMS]).splitlines()[1].split() == \
        ["greedy", "gpt2", "ok", "ok", "ok"]
