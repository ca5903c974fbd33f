"""lm-eval end to end: `simple_evaluate` on a local multiple-choice task, the registry and the command line."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval.api", reason="lm-eval is not installed (pip install -e '.[lm-eval]')")
pytest.importorskip("accelerate")  # lm-eval's HFLM, the reference, imports it

from lm_eval import simple_evaluate
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
from transformers import AutoTokenizer

from hfbridge.lm_eval import HFBridgeLM

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")


def tasks(folder):
    """The local task alone (indexing lm-eval's own thousands of tasks takes half a minute)."""
    return TaskManager(include_path=str(folder), include_defaults=False)


def accuracies(results, task="tiny_choice"):
    metrics = results["results"][task]
    return metrics["acc,none"], metrics["acc_norm,none"]


@pytest.fixture(scope="module")
def reference(folder, hf_model):
    """HFLM's accuracies on the local task."""
    lm = HFLM(pretrained=hf_model, tokenizer=AutoTokenizer.from_pretrained(folder), batch_size=4)
    return accuracies(simple_evaluate(model=lm, tasks=["tiny_choice"], task_manager=tasks(folder),
                                      random_seed=0, bootstrap_iters=0))


def test_simple_evaluate_gives_hflms_accuracy(folder, hf_model, tokenizer, reference):
    lm = HFBridgeLM(lambda ids: hf_model(ids).logits, tokenizer, batch_size=4, max_length=64)
    ours = simple_evaluate(model=lm, tasks=["tiny_choice"], task_manager=tasks(folder),
                           random_seed=0, bootstrap_iters=0)
    assert accuracies(ours) == reference
    assert 0 < reference[0] < 1  # the random model gets some right and some wrong: the comparison means something


def test_simple_evaluate_by_name_with_model_args(folder, reference, monkeypatch):
    monkeypatch.syspath_prepend(str(folder))
    write_build_module(folder)
    ours = simple_evaluate(model="hfbridge", model_args=f"model=tiny_build:build,tokenizer={folder},batch_size=3",
                           tasks=["tiny_choice"], task_manager=tasks(folder),
                           random_seed=0, bootstrap_iters=0)
    assert accuracies(ours) == reference


def write_build_module(folder):
    (folder / "tiny_build.py").write_text(
        "from transformers import GPT2LMHeadModel\n\n\n"
        "def build():\n"
        f"    return GPT2LMHeadModel.from_pretrained({str(folder)!r}).eval()\n")


def test_the_command_line(folder, reference, tmp_path):
    write_build_module(folder)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "hfbridge.lm_eval", "--model", "hfbridge",
               "--model_args", f"model=tiny_build:build,tokenizer={folder}", "--tasks", "tiny_choice",
               "--include_path", str(folder), "--batch_size", "4", "--output_path", str(tmp_path / "out"),
               "--seed", "0"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tiny_choice" in done.stdout
    written = list((tmp_path / "out").rglob("results_*.json"))
    assert len(written) == 1, list((tmp_path / "out").rglob("*"))
    assert accuracies(json.loads(written[0].read_text())) == reference


def test_registered_by_importing_the_package():
    from lm_eval.api.registry import get_model
    assert get_model("hfbridge") is HFBridgeLM


def test_only_the_optional_package_imports_lm_eval():
    # `import hfbridge` must work without lm-eval: no module outside hfbridge/lm_eval imports it
    package = ROOT / "hfbridge"
    importers = []
    for path in package.rglob("*.py"):
        if path.parent.name == "lm_eval" and path.parent.parent == package:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(name.split(".")[0] == "lm_eval" for name in names):
                importers.append(str(path.relative_to(ROOT)))
    assert not importers
