"""hfbridge's runtime dependencies stay the ones setup.cfg declares, or ones those bring for sure."""

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hfbridge"
DECLARED = {"torch", "transformers", "einops"}
# numpy: the CPU routes read tensors through NumPy views; transformers requires numpy unconditionally.
VIA_TRANSFORMERS = {"numpy"}
OPTIONAL = {"matplotlib", "IPython", "tqdm", "xgrammar", "tokenizers"}  # imported inside functions, with a hint
# The optional subpackage hfbridge/lm_eval (extra `lm-eval`) imports lm-eval and what lm-eval requires.
LM_EVAL = {"lm_eval", "jinja2", "tqdm"}


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
        imported = top_level_imports(path) - set(sys.stdlib_module_names) - {"hfbridge", "__future__"}
        if path.parent == PACKAGE / "lm_eval":
            imported -= LM_EVAL
        third_party |= imported
    assert third_party <= DECLARED | VIA_TRANSFORMERS | OPTIONAL, third_party - DECLARED - VIA_TRANSFORMERS


def test_transformers_requires_numpy_unconditionally():
    requirements = importlib.metadata.requires("transformers") or []
    assert any(re.match(r"numpy\s*[>=<~ ]", r) and "extra ==" not in r for r in requirements), requirements
