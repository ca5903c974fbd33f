"""Hand-written tables of option or processor-class names in hfbridge's source, found with `ast`.

A *name table* is a literal tuple, list, set or dict (its keys), anywhere in a module (at module level or inline
in a function), that holds at least two strings naming an option of the registry (`option_table.ROWS`,
`hf_option_rows.HF_OPTION_ROWS`) or a logits processor class (transformers' `logits_process` classes and
`hfbridge.processors`'), a name in backquotes (`"`top_k"`, as error texts hold them) included; or that holds at
least two such classes themselves (`isinstance(p, (A, B))`). `__all__` and `__slots__` are not tables, and the
registry's own modules (`REGISTRY`) are where the names belong.

`tests/test_name_tables.py` fails when a new one appears; `benchmarks/count_tables.py` counts them in any tree.

>>> import ast
>>> tree = ast.parse("SKIP = ('top_k', 'top_p')\\ndef f(kind):\\n    return kind in {'TopKLogitsWarper', 'x'}")
>>> [(table.owner, table.names) for table in tables_in(tree, frozenset({"top_k", "top_p"}), frozenset())]
[('SKIP', ('top_k', 'top_p'))]
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Iterator
from pathlib import Path

__all__ = ["REGISTRY", "Table", "find_tables", "tables_in", "vocabulary"]

# The registry's modules, by file name (the rows and the classes' traits): the names belong there.
REGISTRY = frozenset({"option_table.py", "hf_option_rows.py", "_traits.py"})


@dataclasses.dataclass(frozen=True)
class Table:
    """One name table.

    Attributes:
        path: The module, relative to the folder that holds the package (`hfbridge/_step/plan/per_row.py`).
        line: Where the literal starts.
        owner: The name it is assigned to, else the function (or class) it sits in, else "<module>".
        names: The option and class names it holds, in its order.
    """

    path: str
    line: int
    owner: str
    names: tuple[str, ...]

    @property
    def key(self) -> tuple[str, str, str]:
        """`(wing, file name, owner)`: stable when a module moves within its wing (`_step/x.py` -> `_step/plan/x.py`)."""
        parts = Path(self.path).parts
        return parts[1] if len(parts) > 2 else "", parts[-1], self.owner


def vocabulary() -> tuple[frozenset[str], frozenset[str]]:
    """`(option names, processor class names)`: the registry's options, and the logits processor classes of the
    installed transformers and of `hfbridge.processors`."""
    import transformers.generation.logits_process as hf_processors
    from transformers import LogitsProcessor

    import hfbridge.processors as ours
    from hfbridge._step.plan.hf_option_rows import HF_OPTION_ROWS
    from hfbridge._step.plan.option_table import ROWS

    classes = {name for module in (hf_processors, ours) for name, value in vars(module).items()
               if inspect.isclass(value) and issubclass(value, LogitsProcessor) and value is not LogitsProcessor}
    return frozenset(ROWS) | frozenset(HF_OPTION_ROWS), frozenset(classes)


def _elements(node: ast.AST) -> list[ast.expr] | None:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return node.elts
    if isinstance(node, ast.Dict):
        return [key for key in node.keys if key is not None]
    return None


def _owners(tree: ast.AST) -> dict[int, str]:
    """id(node) -> its owner (see `Table.owner`), for every node under an assignment, function or class."""
    owners: dict[int, str] = {}

    def visit(node: ast.AST, owner: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            owner = node.name
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [target.id for target in targets if isinstance(target, ast.Name)]
            if names:
                owner = names[0]
        owners[id(node)] = owner
        for child in ast.iter_child_nodes(node):
            visit(child, owner)

    visit(tree, "<module>")
    return owners


def tables_in(tree: ast.AST, options: frozenset[str], classes: frozenset[str], path: str = "") -> Iterator[Table]:
    """The name tables of one parsed module, in the order of the source."""
    owners = _owners(tree)
    nodes = sorted((node for node in ast.walk(tree) if hasattr(node, "lineno")),
                   key=lambda node: (node.lineno, node.col_offset))
    for node in nodes:
        elements = _elements(node)
        if elements is None or owners.get(id(node)) in ("__all__", "__slots__"):
            continue
        names = []
        for element in elements:
            if isinstance(element, ast.Constant) and isinstance(element.value, str):
                name = element.value.strip("`")
                if name in options or name in classes:
                    names.append(name)
            elif isinstance(element, (ast.Name, ast.Attribute)):
                name = element.id if isinstance(element, ast.Name) else element.attr
                if name in classes:
                    names.append(name)
        if len(names) >= 2:
            yield Table(path, node.lineno, owners[id(node)], tuple(names))


def find_tables(package: Path, options: frozenset[str], classes: frozenset[str]) -> list[Table]:
    """Every name table in the package at `package` (a folder), the registry's modules aside, by path and line."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name in REGISTRY:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found.extend(tables_in(tree, options, classes, str(path.relative_to(package.parent))))
    return sorted(found, key=lambda table: (table.path, table.line))
