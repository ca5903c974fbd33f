"""docs/versions.md says which transformers releases CI runs; it must say what .ci/run does."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _ci_lines() -> list[str]:
    text = (ROOT / ".ci" / "run").read_text()
    return re.search(r'TRANSFORMERS_LINES="([^"]+)"', text).group(1).split()


def _doc_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    first_section = (ROOT / "docs" / "versions.md").read_text().split("\n## ", 1)[0]  # the table of lines
    for row in first_section.splitlines():
        cells = [cell.strip(" `") for cell in row.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"\d+\.\d+", cells[0]):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_every_line_ci_runs_is_in_the_table_with_its_release():
    rows = _doc_rows()
    for release in _ci_lines():
        assert _minor(release) in rows, f"{release} runs in CI but docs/versions.md has no row for it"
        assert rows[_minor(release)][0] == release
        assert "parity" in rows[_minor(release)][1]


def test_one_release_per_minor_line_and_no_gap():
    lines = [_minor(release) for release in _ci_lines()]
    assert len(lines) == len(set(lines))
    floor = re.search(r"transformers>=([\d.]+)", (ROOT / "setup.cfg").read_text()).group(1)
    rows = _doc_rows()
    assert rows[_minor(floor)][0] == floor and "full suite" in rows[_minor(floor)][1]
    excluded = re.findall(r"!=(\d+\.\d+)\.\*", (ROOT / "setup.cfg").read_text())  # lines setup.cfg leaves out
    for line in excluded:
        assert line not in lines and "excluded" in rows[line][1]
    majors: dict[int, list[int]] = {}
    for line in [*lines, _minor(floor), *excluded]:
        major, minor = map(int, line.split("."))
        majors.setdefault(major, []).append(minor)
    for major, minors in majors.items():  # every minor line of a major, from its first one CI runs
        assert sorted(minors) == list(range(min(minors), max(minors) + 1)), f"a {major}.x line is missing"


def test_setup_cfg_admits_the_newest_release():
    spec = re.search(r"transformers>=[^\n]*,<([\d.]+)", (ROOT / "setup.cfg").read_text()).group(1)
    newest = max((tuple(map(int, line.split("."))) for line in _doc_rows()), default=(0, 0))
    assert tuple(map(int, spec.split("."))) > newest  # no upper bound below what users get from pip
