"""The documentation: its Python examples run, its pages are the ones mkdocs.yml lists, its links resolve.

CI also builds it with `mkdocs build --strict` (a missing name in the API reference fails there).
"""

import re
from pathlib import Path

import pytest
from _examples import run_example

from hfbridge._hf import names

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def python_blocks(path: Path) -> list[str]:
    """A page's self-contained Python examples: the blocks that start with their imports."""
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)
    return [block for block in blocks if block.startswith(("import ", "from "))]


def nav_pages() -> list[str]:
    return re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)


# The pages written with the wings; the others in the nav come with their own features and tests.
WING_PAGES = ["index.md", "step.md", "fast_path.md", "generate.md", "models_and_caches.md", "views.md", "demo.md",
              "architecture.md", "api.md"]


def test_the_wing_pages_are_in_the_nav():
    assert set(WING_PAGES) <= set(nav_pages())
    assert all((DOCS / page).is_file() for page in WING_PAGES)


def test_every_page_in_docs_is_in_the_nav():
    assert {path.name for path in DOCS.glob("*.md")} <= set(nav_pages())


# Pages of the optional wings: their examples run where the extra is installed (its own CI step tests the wing).
PAGE_NEEDS = {"lm_eval.md": "lm_eval.api", "vllm.md": "vllm.v1"}
# Pages whose examples need a newer transformers than the oldest supported.
PAGE_TRANSFORMERS = {"transformers_generate.md": (4, 57)}  # `generate(custom_generate=<callable>)`


@pytest.mark.parametrize("page", [p.name for p in sorted(DOCS.glob("*.md")) if python_blocks(p)])
def test_page_examples_run_warning_free(page):
    """Every page's self-contained examples (a fragment starts with a comment naming what it assumes)."""
    if page in PAGE_NEEDS:
        pytest.importorskip(PAGE_NEEDS[page])
    if page in PAGE_TRANSFORMERS and names.TRANSFORMERS_VERSION[:2] < PAGE_TRANSFORMERS[page]:
        pytest.skip(f"its examples need transformers {'.'.join(map(str, PAGE_TRANSFORMERS[page]))} or newer")
    for example in python_blocks(DOCS / page):
        run_example(example, f"docs/{page}")  # any warning (a renamed transformers keyword) is an error


@pytest.mark.parametrize("page", WING_PAGES)
def test_links_between_pages_resolve(page):
    text = (DOCS / page).read_text()
    for target in re.findall(r"\]\(([^)#\s]+\.(?:md|png))(?:#[^)]*)?\)", text):
        assert target in nav_pages() or (DOCS / target).is_file(), f"docs/{page} links to {target}"


def test_api_reference_names_every_public_name():
    import hfbridge

    text = (DOCS / "api.md").read_text()
    missing = [name for name in hfbridge.__all__ if f"::: hfbridge.{name}\n" not in text]
    assert not missing, f"docs/api.md lacks {missing}"


def test_user_facing_pages_name_no_private_module():
    for page in ["index.md", "step.md", "generate.md", "models_and_caches.md", "views.md", "demo.md"]:
        private = sorted(set(re.findall(r"hfbridge(?:\.\w+)*\._(?!_)\w+", (DOCS / page).read_text())))
        assert not private, f"docs/{page} names {private}"


def test_doctests_become_code_blocks_in_the_api_reference():
    pytest.importorskip("griffe")  # the docs extra
    import importlib.util

    spec = importlib.util.spec_from_file_location("doctests_as_code", DOCS / "_griffe" / "doctests_as_code.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = "Adds.\n\n>>> [1]\n[1]\n\nArgs:\n    x: a value.\n\n    >>> x\n"
    assert module.fence_doctests(text) == (
        "Adds.\n\n```pycon\n>>> [1]\n[1]\n```\n\nArgs:\n    x: a value.\n\n    ```pycon\n    >>> x\n    ```")


def test_guides_link_signatures_instead_of_copying_them():
    """Hand-copied signatures drift from the code; the guides link the generated API reference."""
    assert "generate(model, input_ids, *" not in (DOCS / "generate.md").read_text()
    assert "sample_step(logits, input_ids=None, *" not in (DOCS / "step.md").read_text()
    assert "api.md#hfbridge.generate" in (DOCS / "generate.md").read_text()


def test_api_reference_reads(tmp_path):
    """The built reference: formatted signatures with every keyword, one Returns block per function,
    no private base or module in the text, `generate` once in the table of contents."""
    pytest.importorskip("mkdocstrings_handlers.python")
    import html
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path)],
                   cwd=ROOT, check=True)
    page = (tmp_path / "api" / "index.html").read_text()
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert not re.search(r"Bases: \w*StepInputs|hfbridge\._\w|_generate/|_step/", text)
    for returns in re.findall(r'doc-section-title">Returns:.*?</table>', page, flags=re.S):
        assert returns.count('<tr class="doc-section-item">') == 1
    assert re.findall(r'<a href="#([^"]+)"', page).count("hfbridge.generate") == 1
    assert "generate" not in re.findall(r'<a href="#([^"]+)"', page)  # no section of the same name
    generate = text[text.index("\ngenerate(\n"):]
    generate = generate[:generate.index("\n)")]  # one keyword per line: formatted
    for keyword in ("prefix_allowed_tokens_fn", "assistant_model", "check_every", "synced_gpus", "vocab_size"):
        assert f"\n    {keyword}:" in generate
    assert text.count("\ngenerate(\n") == 1  # the implementation's signature, not the overloads'
    step = text[text.index("\nsample_step(\n"):]
    step = step[:step.index("\n)")]
    for keyword in ("unconditional_logits", "tokenizer", "prefix_allowed_tokens_fn"):
        assert f"\n    {keyword}:" in step
    assert "dry_multiplier" in text[text.index("\nsample_step(\n"):text.index("hfbridge.Sampler")]
