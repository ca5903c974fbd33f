"""Count the hand-written tables of names in hfbridge's source (issue 37: "26 -> 0"), in this checkout or another tree.

Two counts, both read with `ast` (nothing of the scanned tree is imported):

1. **Name tables** (`tests/_name_tables.py`, which `tests/test_name_tables.py` holds at its allowed list): literal
   tuples, lists, sets and dicts (keys) anywhere in a module, at module level or inline, holding >= 2 strings that
   name an option of the registry or a logits processor class (or >= 2 such classes themselves); the registry's own
   modules (`option_table.py`, `hf_option_rows.py`, `processors/_traits.py`) and `__all__` / `__slots__` aside.
   The vocabulary (option and class names) is this checkout's registry and the installed transformers', so two
   trees are counted against the same names.
2. **Module-level literal tables** (the count issue 37's first round used): module-level assignments in
   `hfbridge/_step` whose value is a literal tuple, list, set or dict (or `frozenset(...)` / `set(...)` /
   `tuple(...)` of one) holding >= 2 identifier strings, whatever they name; `__all__` / `__slots__` aside.

    python benchmarks/count_tables.py                   # this checkout
    python benchmarks/count_tables.py --root /tmp/base  # another tree (e.g. a worktree of an older commit)
    python benchmarks/count_tables.py --list            # and each table, with file:line
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "tests"))

from _name_tables import find_tables, vocabulary  # noqa: E402

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WRAPPERS = ("frozenset", "set", "tuple", "list")


def _literal_names(value: ast.expr) -> list[str]:
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _WRAPPERS \
            and len(value.args) == 1:
        value = value.args[0]
    if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
        elements = value.elts
    elif isinstance(value, ast.Dict):
        elements = [key for key in value.keys if key is not None]
    else:
        return []
    return [element.value for element in elements if isinstance(element, ast.Constant)
            and isinstance(element.value, str) and _IDENTIFIER.match(element.value)]


def module_level_tables(folder: Path) -> list[tuple[str, int, str, list[str]]]:
    """`(path, line, assigned name, names)` of each module-level literal table under `folder`."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            owner = next((target.id for target in targets if isinstance(target, ast.Name)), "?")
            names = _literal_names(node.value)
            if owner not in ("__all__", "__slots__") and len(names) >= 2:
                found.append((str(path.relative_to(folder.parent.parent)), node.lineno, owner, names))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to scan (holds hfbridge/)")
    parser.add_argument("--list", action="store_true", help="list each table")
    args = parser.parse_args()
    package = args.root.resolve() / "hfbridge"
    options, classes = vocabulary()
    tables = find_tables(package, options, classes)
    in_step = [table for table in tables if Path(table.path).parts[1] == "_step"]
    literal = module_level_tables(package / "_step")
    print(f"tree: {args.root.resolve()}  (vocabulary: {len(options)} options, {len(classes)} processor classes)")
    print(f"name tables of options / processor classes: {len(tables)} in hfbridge/, {len(in_step)} in hfbridge/_step")
    print(f"module-level literal tables of >= 2 identifier strings in hfbridge/_step: {len(literal)}")
    if args.list:
        print("\nname tables:")
        for table in tables:
            print(f"  {table.path}:{table.line}  {table.owner}  {', '.join(table.names)}")
        print("\nmodule-level literal tables in hfbridge/_step:")
        for path, line, owner, names in literal:
            print(f"  {path}:{line}  {owner}  {', '.join(names[:6])}{', ...' if len(names) > 6 else ''}")


if __name__ == "__main__":
    main()
