"""The package's shape: imports go down DESIGN.md's wing table, no module imports another in a loop.

The graph is read from the source with `ast` (every `import` and `from ... import` of an hfbridge
module, at module level or inside a function), not from `sys.modules`, so an import hidden in a
function counts as much as one at the top. Imports under `if TYPE_CHECKING:` are type-only: they
never run, but they follow the wing table and make no cycle either (a type named in a loop of
modules belongs below all of them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hfbridge"


def module_names() -> dict[str, Path]:
    """Every module of hfbridge by its dotted name (a package by its own name, not `.__init__`)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


MODULES = module_names()


def _known(name: str) -> str:
    """The module `name` refers to: itself, or the longest module prefix (`a.b.func` -> `a.b`)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _type_only_nodes(tree: ast.Module) -> set[int]:
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside |= {id(sub) for sub in ast.walk(node)}
    return inside


def imports_of(module: str, *, type_only: bool = False) -> set[str]:
    """The hfbridge modules `module` imports at run time (and under TYPE_CHECKING when `type_only`)."""
    tree = ast.parse(MODULES[module].read_text())
    skip = set() if type_only else _type_only_nodes(tree)
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {_known(alias.name) for alias in node.names if alias.name.split(".")[0] == "hfbridge"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "hfbridge":
                continue
            for alias in node.names:  # `from pkg import module` imports the module itself
                found.add(_known(f"{base}.{alias.name}"))
    return found - {module}


GRAPH = {module: imports_of(module) for module in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a list of modules (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_reader_sees_known_edges():
    # the reader sees the imports that matter: a sample of known edges of the real package
    assert "hfbridge._generate.call" in GRAPH["hfbridge._generate.hf_loops.assisted"]
    assert "hfbridge._step.fast.fast_path" in GRAPH["hfbridge._step.run.sampler_choice"]
    assert "hfbridge._generate.prepared" in GRAPH["hfbridge._generate.loop"]  # `Call`, below the loop
    assert "hfbridge._generate.call" not in imports_of("hfbridge._generate.loop", type_only=True)


def test_no_runtime_import_cycle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "runtime import cycle: " + " -> ".join(cycle or [])


# DESIGN.md's wing table: each wing (a package prefix) and the wings it may import besides itself.
# The most specific prefix names a module's wing; `_step.fast` is part of `_step` but listed on its own
# because the step's own modules may call the fast path while the fast path may not call them back.
WINGS = {
    "hfbridge._hf": set(),
    "hfbridge.processors": set(),
    "hfbridge._models": {"hfbridge._hf"},
    "hfbridge._step": {"hfbridge._hf", "hfbridge.processors", "hfbridge._step.fast"},
    "hfbridge._step.fast": {"hfbridge._step.run.cpu_shortcuts", "hfbridge._step.run.processor_list",
                            "hfbridge._step.plan.processor_repr", "hfbridge._step.checks.row_errors", "hfbridge.processors"},
    "hfbridge._generate": {"hfbridge._step", "hfbridge._models", "hfbridge._hf"},
    "hfbridge._views": {"hfbridge._step", "hfbridge._generate"},
    "hfbridge.vllm": {"hfbridge._step", "hfbridge.processors"},  # and vLLM (optional)
    "hfbridge.sglang": {"hfbridge._step", "hfbridge.processors"},  # and SGLang (optional)
    "hfbridge.demo": {"hfbridge", "hfbridge.processors"},  # public names only
    "hfbridge.__main__": {"hfbridge", "hfbridge.processors", "hfbridge.demo"},
    "hfbridge.lm_eval": {"hfbridge", "hfbridge.processors"},  # public names only (and lm-eval)
}


def wing_of(module: str) -> str | None:
    matches = [wing for wing in WINGS if module == wing or module.startswith(wing + ".")]
    return max(matches, key=len) if matches else None


TYPED_GRAPH = {module: imports_of(module, type_only=True) for module in MODULES}


def test_type_only_imports_are_seen():
    assert "hfbridge._views.generation_record" in TYPED_GRAPH["hfbridge._views.trace_view"]  # TYPE_CHECKING only
    assert "hfbridge._views.generation_record" not in GRAPH["hfbridge._views.trace_view"]


@pytest.mark.parametrize("wing", sorted(WINGS))
def test_no_import_cycle_type_only_included(wing):
    # across wings a cycle needs an upward import, which the wing table refuses (type-only ones too)
    inside = {module: {m for m in imported if wing_of(m) == wing} for module, imported in TYPED_GRAPH.items()
              if wing_of(module) == wing}
    cycle = find_cycle(inside)
    assert cycle is None, "import cycle (type-only imports included): " + " -> ".join(cycle or [])


def allowed(importer: str, imported: str) -> bool:
    wing = wing_of(importer)
    if wing is None:  # hfbridge/__init__.py: the public names, from anywhere
        return True
    targets = WINGS[wing] | {wing}
    # "hfbridge" as a target is the public package alone, not every module under it
    return any(imported == target or (target != "hfbridge" and imported.startswith(target + "."))
               for target in targets)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_wing_table(module):
    wrong = sorted(imported for imported in imports_of(module, type_only=True) if not allowed(module, imported))
    assert not wrong, f"{module} ({wing_of(module)}) imports {wrong}, against DESIGN.md's wing table"


def test_every_module_has_a_wing():
    homeless = [m for m in MODULES if wing_of(m) is None and m != "hfbridge"]
    assert not homeless, homeless


@pytest.mark.parametrize(("importer", "imported"), [
    ("hfbridge._step.run.sampler", "hfbridge._generate.loop"),
    ("hfbridge._step.fast.fast_path", "hfbridge._step.run.sampler"),
    ("hfbridge._models.adapters", "hfbridge._step.run.layout"),
    ("hfbridge._generate.loop", "hfbridge._views.html"),
    ("hfbridge._hf.stand_in", "hfbridge._step.run.layout"),
    ("hfbridge.processors", "hfbridge._step.run.layout"),
    ("hfbridge.demo._model", "hfbridge._step.run.sampler"),
    ("hfbridge.lm_eval._scoring", "hfbridge._step.checks.caller_inputs"),
])
def test_the_table_refuses_upward_imports(importer, imported):
    assert not allowed(importer, imported)


@pytest.mark.parametrize(("importer", "imported"), [
    ("hfbridge._step.run.sampler", "hfbridge._step.fast.fast_path"),
    ("hfbridge._step.fast.top_p.draw_then_check", "hfbridge._step.fast.candidates"),
    ("hfbridge._step.fast.fast_path", "hfbridge._step.run.cpu_shortcuts"),
    ("hfbridge._generate.loop", "hfbridge._step.run.sampler"),
    ("hfbridge._views.explain_step", "hfbridge._step.fast.fast_path"),
    ("hfbridge._views.explain_generation", "hfbridge._generate.output"),
])
def test_the_table_admits_downward_imports(importer, imported):
    assert allowed(importer, imported)
