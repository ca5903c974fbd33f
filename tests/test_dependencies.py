"""hfbridge's runtime dependencies stay the ones setup.cfg declares, or ones those bring for sure."""

import ast
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hfbridge"
DECLARED = {"torch", "transformers", "einops"}
# numpy: the CPU routes read tensors through NumPy views; regex: banned patterns (partial matches).
# transformers requires both unconditionally.
VIA_TRANSFORMERS = {"numpy", "regex"}
OPTIONAL = {"matplotlib", "IPython", "tqdm", "xgrammar", "tokenizers"}  # imported inside functions, with a hint
# Optional wings: a package imported at module level only inside its own wing, which `import hfbridge` never loads.
OPTIONAL_WINGS = {"vllm": PACKAGE / "vllm", "sglang": PACKAGE / "sglang"}
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
        names = top_level_imports(path) - set(sys.stdlib_module_names) - {"hfbridge", "__future__"}
        if path.parent == PACKAGE / "lm_eval":
            names -= LM_EVAL
        third_party |= {name for name in names if not (name in OPTIONAL_WINGS and OPTIONAL_WINGS[name] in path.parents)}
    assert third_party <= DECLARED | VIA_TRANSFORMERS | OPTIONAL, third_party - DECLARED - VIA_TRANSFORMERS


def test_importing_hfbridge_never_imports_an_optional_wings_package():
    code = ("import sys, hfbridge, hfbridge.processors, hfbridge.vllm, hfbridge.vllm._batch, hfbridge.sglang, "
            "hfbridge.sglang._calls; "
            f"print(sorted(set(sys.modules) & set({sorted(OPTIONAL_WINGS)!r})))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_transformers_requires_numpy_and_regex_unconditionally():
    requirements = importlib.metadata.requires("transformers") or []
    for name in sorted(VIA_TRANSFORMERS):
        assert any(re.match(name + r"\s*[!>=<~ ]", r) and "extra ==" not in r for r in requirements), requirements
