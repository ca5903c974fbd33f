"""Every notebook in notebooks/ runs top to bottom in a fresh kernel, offline.

Notebooks are committed without outputs (clean diffs; they are run here instead), which is
checked too. They run with matplotlib's inline backend, as in Jupyter, so a plot that should
appear once is checked to produce exactly one image.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.name[:3] for p in NOTEBOOKS] == ["01_", "02_", "03_", "04_", "05_", "06_", "07_", "08_", "09_", "10_", "11_"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    cells = json.loads(path.read_text())["cells"]  # as committed: nbformat's reader fills missing ids in
    assert all("id" in cell for cell in cells), f"{path.name}: a cell without an id (nbformat warns)"
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: clear the outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, monkeypatch):
    # The kernel is a child process: it must find this checkout's hfbridge and stay offline.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(path, as_version=4)
    if any("import xgrammar" in cell.source for cell in notebook.cells):
        pytest.importorskip("xgrammar", reason="notebook needs the `grammar` extra")
    client = nbclient.NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.outputs:
            assert output.output_type != "error", output
        if "NotebookStreamer(" in cell.source:
            # One output growing in place, not one per streamed word (which exports as a word per line).
            assert len(cell.outputs) == 1 and cell.outputs[0].output_type == "display_data", cell.outputs
            assert cell.outputs[0].data["text/plain"].count(" ") > 10
        if ".plot(" in cell.source:
            images = [o for o in cell.outputs if "image/png" in o.get("data", {})]
            assert len(images) == 1, f"{path.name}: a .plot() cell should show one figure:\n{cell.source}"
    if path.name.startswith("07_"):
        check_each_sampler_shows(notebook)


def _text(cell) -> str:
    return "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.outputs)


def _rank_one(trace_text: str) -> list[str]:
    """The best token of each stage of an `explain_step` printed as text."""
    return re.findall(r"^\s+1  (.+?)\s+-?[\d.]+\s+[\d.]+(?:  <- chosen)?$", trace_text, flags=re.M)


def check_each_sampler_shows(notebook) -> None:
    """Notebook 07: each sampler changes the text it is shown on, and its step's distribution."""
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    warpers = _text(next(cell for cell in cells if "warpers = {" in cell.source))
    texts = dict(line.split(": ", 1) for line in warpers.strip().splitlines())
    assert len(texts) == 6 and len(set(texts.values())) == 6, texts  # every warper changes the text
    penalties = next(cell for cell in cells if "penalties = {" in cell.source)
    repeats = {name.strip(): int(n) for name, n in re.findall(r"^(.*): the longest repeat is (\d+) tokens$",
                                                              _text(penalties), flags=re.M)}
    assert repeats["greedy"] > repeats["presence / frequency"] > repeats["DRY"], repeats
    shown = "".join(o["data"]["text/html"] for o in penalties.outputs if "text/html" in o.get("data", {}))
    columns = re.findall(r"white-space:pre-wrap'>(.*?)</span>", shown, flags=re.S)
    assert len(columns) == 3 and len(set(columns)) == 3
    for marker in ("presence_penalty=1.0", "dry_multiplier=0.8, top=6"):
        trace = _text(next(cell for cell in cells if marker in cell.source and "explain_step(" in cell.source))
        best = _rank_one(trace)
        assert len(best) == 2 and best[0] != best[1], trace  # the processor changed the most likely token
