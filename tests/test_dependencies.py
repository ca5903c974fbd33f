"""hfbridge's runtime dependencies stay the ones setup.cfg declares, or ones those bring for sure."""

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hfbridge"
DECLARED = {"torch", "transformers", "einops"}
# numpy: the CPU routes read tensors through NumPy views; regex: banned patterns (partial matches).
# transformers requires both unconditionally.
VIA_TRANSFORMERS = {"numpy", "regex"}
OPTIONAL = {"matplotlib", "IPython", "tqdm", "xgrammar", "tokenizers"}  # imported inside functions, with a hint


def top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:  # module level only: optional imports live in functions
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_module_level_imports_are_declared_or_come_with_transformers():
    third_party = set()
    for path in PACKAGE.rglob("*.py"):
        third_party |= top_level_imports(path) - set(sys.stdlib_module_names) - {"hfbridge", "__future__"}
    assert third_party <= DECLARED | VIA_TRANSFORMERS | OPTIONAL, third_party - DECLARED - VIA_TRANSFORMERS


def test_transformers_requires_numpy_and_regex_unconditionally():
    requirements = importlib.metadata.requires("transformers") or []
    for name in sorted(VIA_TRANSFORMERS):
        assert any(re.match(name + r"\s*[!>=<~ ]", r) and "extra ==" not in r for r in requirements), requirements
