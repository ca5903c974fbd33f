"""The README's quick-start commands stay the ones CI runs."""

import re
from pathlib import Path

from _examples import run_example

ROOT = Path(__file__).resolve().parent.parent


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line and not line.startswith("#")]


def test_quick_start_has_exactly_two_commands():
    commands = quick_start_commands()
    assert len(commands) == 2
    assert commands[0].endswith("python -m hfbridge demo")
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    assert quick_start_commands()[1] in (ROOT / ".ci" / "run").read_text()


def test_ci_oldest_transformers_is_the_setup_cfg_floor():
    floor = re.search(r"transformers>=([\d.]+)", (ROOT / "setup.cfg").read_text()).group(1)
    oldest = re.search(r'TRANSFORMERS_OLDEST="([\d.]+)"', (ROOT / ".ci" / "run").read_text()).group(1)
    assert oldest == floor  # the floor setup.cfg declares is the one CI runs


def test_supported_versions_table_matches_setup_cfg():
    setup_cfg = (ROOT / "setup.cfg").read_text()
    section = (ROOT / "README.md").read_text().split("## Supported versions", 1)[1].split("\n## ", 1)[0]
    first_table = section.strip().split("\n\n", 1)[0].splitlines()[2:]  # the rows under the header
    lowest = {row.split("|")[1].strip(" `"): row.split("|")[2].strip() for row in first_table}
    assert f"torch>={lowest['torch']}" in setup_cfg
    assert f"transformers>={lowest['transformers']}," in setup_cfg
    assert f"python_requires = >={lowest['Python']}" in setup_cfg


def runnable_examples(name: str = "README.md") -> list[str]:
    """The self-contained Python examples of `name`: the blocks that start with their imports."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / name).read_text(), flags=re.S)
    return [block for block in blocks if block.startswith(("import ", "from "))]


def test_readme_examples_run_warning_free():
    examples = runnable_examples()
    assert len(examples) >= 4
    for example in examples:
        run_example(example, "README.md")  # any warning (a renamed transformers keyword) is an error


def test_changelog_examples_run_warning_free():
    examples = runnable_examples("CHANGELOG.md")
    assert examples
    for example in examples:
        run_example(example, "CHANGELOG.md")


def test_dated_facts_live_in_the_changelog():
    readme = (ROOT / "README.md").read_text()
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b|commit [0-9a-f]{7}", readme)  # dates and commits go stale
    assert "## What 0.2 adds" not in readme and "## 0.2.0" in (ROOT / "CHANGELOG.md").read_text()
