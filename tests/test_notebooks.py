"""Every notebook in notebooks/ runs top to bottom in a fresh kernel, offline.

Notebooks are committed without outputs (clean diffs; they are run here instead), which is
checked too. They run with matplotlib's inline backend, as in Jupyter, so a plot that should
appear once is checked to produce exactly one image.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.name[:3] for p in NOTEBOOKS] == ["01_", "02_", "03_", "04_", "05_", "06_", "07_", "08_", "09_"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
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
