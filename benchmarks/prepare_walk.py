"""The way one `generate` call's options go through hfbridge while `prepare` runs (issue 37: "the prepare walk").

`generate(model, ids, do_sample=True, top_p=0.9, dry_multiplier=0.8, tokenizer=tok, max_new_tokens=4)` on a tiny
random `LlamaForCausalLM` (built from a config, seed 0) with a character tokenizer built with the `tokenizers`
library (nothing downloaded). The call runs once untraced (imports, caches), then once with `sys.setprofile`
recording every Python call and return of a function defined in the measured tree's `hfbridge/` while
`hfbridge._generate.call.prepare` runs (`--cold`: trace the first call instead; `--whole`: trace all of
`generate`'s `_generate`, the strategy's run and its four steps included).

Definitions (functions of other packages are invisible: a call from hfbridge into transformers that calls back
into hfbridge is a call from the first hfbridge function to the second):

- **walk**: the files of the hfbridge `call` events, in order (`prepare`'s own call first). A comprehension, a
  generator's resumption and a lambda are calls too (each in the file of its code).
- **stays**: the maximal runs of consecutive equal files in the walk, i.e. 1 + the number of calls whose file
  differs from the previous call's: each time the walk enters a file.
- **files**: the distinct files of the walk.
- **climbs back up the stack**: calls into a file F, from a function of another file, while a function of F is
  further down the current stack of hfbridge frames (an ancestor of the caller): the walk goes back into a
  module it has not finished with (`call.prepare` -> `loop.decode` -> `call.x` would be one).
- **climbs up the imports**: calls from a function of module G into a function of module F where F imports G
  (directly or through other hfbridge modules; every `import` of the file read with `ast`, those inside functions
  and under `TYPE_CHECKING` included). Imports go down the wings, so such a call runs a function or object handed
  down from above (a callback, a table of functions passed in, a method of a class defined above): the walk
  climbs back up the package (`generate.py` handing the strategy table's checks to `call.prepare` is one).
- **zigzags**: consecutive stays (A, B) where B imports A (directly or through others): having gone down to A,
  the walk returned up past it and went on in a module above it (the back and forth of "split, check, put on the
  config, read off the config again").
- **re-entries**: stays minus files, the times the walk comes back to a file it visited before.

    python benchmarks/prepare_walk.py                       # this checkout
    python benchmarks/prepare_walk.py --root /tmp/base      # another tree's hfbridge (a worktree of a commit)
    python benchmarks/prepare_walk.py --walk                # and the walk, stay by stay
    python benchmarks/prepare_walk.py --whole               # the whole call, not only `prepare`
"""

from __future__ import annotations

import argparse
import ast
import collections
import itertools
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def tiny_llama() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


def char_tokenizer() -> Any:
    """`<eos>`=0, `<pad>`=1, then one token per character (as `tests/_tiny_models.char_tokenizer`)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = list("abcdefghijklmnopqrstuvwxyz {}\":,0123456789.")
    vocab = {token: index for index, token in enumerate(["<eos>", "<pad>", *chars])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")


class Walk:
    """The hfbridge calls made while `prepare` runs (see the module for the definitions)."""

    def __init__(self, package: Path, prepare_code: Any):  # prepare's code, or any function's to trace
        self.package = str(package) + "/"
        self.prepare_code = prepare_code
        self.files: list[str] = []  # the walk: the file of each call
        self.functions: list[str] = []  # the function of each call
        self.climbs: list[tuple[str, str]] = []  # (caller's file, callee's file) of each climb back up the stack
        self.calls: list[tuple[str, str]] = []  # (caller's file, callee's file) of each call between two files
        self._stack: list[str] = []  # the files of the hfbridge frames running now
        self._prepare: Any = None  # prepare's frame, while it runs

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        code = frame.f_code
        if not code.co_filename.startswith(self.package):
            return
        if self._prepare is None:
            if event == "call" and code is self.prepare_code:
                self._prepare = frame
            else:
                return
        name = code.co_filename[len(self.package):]
        if event == "call":
            if self._stack and name != self._stack[-1]:
                self.calls.append((self._stack[-1], name))
                if name in self._stack[:-1]:
                    self.climbs.append((self._stack[-1], name))
            self._stack.append(name)
            self.files.append(name)
            self.functions.append(code.co_name)
            return
        self._stack.pop()
        if frame is self._prepare:
            self._prepare = None
            sys.setprofile(None)

    def stays(self) -> list[str]:
        return [name for index, name in enumerate(self.files) if index == 0 or name != self.files[index - 1]]

    def stay_functions(self) -> list[list[str]]:
        """The functions called in each stay, in order."""
        found: list[list[str]] = []
        for index, (name, function) in enumerate(zip(self.files, self.functions)):
            if index == 0 or name != self.files[index - 1]:
                found.append([])
            found[-1].append(function)
        return found


def imports_below(package: Path) -> dict[str, set[str]]:
    """Each file of the package (relative path) -> the files it imports, directly or through others."""
    files = {path.relative_to(package).as_posix(): path for path in package.rglob("*.py")}
    modules = {}
    for name in files:
        parts = ["hfbridge", *Path(name).with_suffix("").parts]
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = name

    def module_file(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return modules.get(dotted)

    direct: dict[str, set[str]] = {}
    for name, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            found.update(target for target in map(module_file, targets) if target not in (None, name))
        direct[name] = found
    below: dict[str, set[str]] = {}
    for name in files:
        seen, todo = set(), list(direct[name])
        while todo:
            other = todo.pop()
            if other not in seen:
                seen.add(other)
                todo.extend(direct[other])
        below[name] = seen
    return below


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree whose hfbridge/ is measured")
    parser.add_argument("--cold", action="store_true", help="trace the first call (imports and caches included)")
    parser.add_argument("--walk", action="store_true", help="print the walk, one stay per line")
    parser.add_argument("--whole", action="store_true", help="trace generate's _generate instead of prepare")
    args = parser.parse_args()
    root = args.root.resolve()
    sys.path.insert(0, str(root))
    import torch

    import hfbridge
    from hfbridge import generate
    from hfbridge._generate import call as call_module
    from hfbridge._generate import generate as generate_module

    assert Path(hfbridge.__file__).resolve().parent == root / "hfbridge", hfbridge.__file__
    torch.set_num_threads(1)
    model, tokenizer = tiny_llama(), char_tokenizer()
    ids = torch.tensor([[5, 6, 7, 8, 9]])

    def run() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return generate(model, ids, do_sample=True, top_p=0.9, dry_multiplier=0.8, tokenizer=tokenizer,
                            max_new_tokens=4, generator=torch.Generator().manual_seed(0))

    if not args.cold:
        run()
    traced = generate_module._generate if args.whole else call_module.prepare
    walk = Walk(root / "hfbridge", traced.__code__)
    sys.setprofile(walk.profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    stays = walk.stays()
    per_file = collections.Counter(stays)
    below = imports_below(root / "hfbridge")
    up = [(caller, callee) for caller, callee in walk.calls if caller in below.get(callee, ())]
    zigzags = [(a, b) for a, b in itertools.pairwise(stays) if a in below.get(b, ())]
    print(f"tree: {root}")
    what = "generate" if args.whole else "prepare"
    print(f"{what} walk: {len(stays)} stays in {len(per_file)} files ({len(stays) - len(per_file)} re-entries), "
          f"{len(zigzags)} zigzags, {len(walk.climbs)} climbs back up the stack, {len(up)} climbs up the imports "
          f"({len(walk.files)} calls, {len(walk.calls)} between files)")
    print("stays per file: " + ", ".join(f"{name} {count}" for name, count in per_file.most_common()))
    for label, pairs in (("zigzags (stay -> next stay)", zigzags), ("climbs back up the stack (caller -> callee)",
                         walk.climbs), ("climbs up the imports (caller -> callee)", up)):
        counted = collections.Counter(pairs)
        print(f"{label}: " + ", ".join(f"{a} -> {b} x{n}" for (a, b), n in counted.most_common()))
    if args.walk:
        print("\nwalk (each stay: its file, the functions it called):")
        for name, functions in zip(stays, walk.stay_functions()):
            shown = ", ".join(dict.fromkeys(functions))
            print(f"  {name}: {shown[:150]}")


if __name__ == "__main__":
    main()
