"""The public surface: every name of 0.1 still imports, the new ones too, and `generate` has one signature.

`generate`'s typed overloads (which pick the return type from `return_dict_in_generate`) repeat its
keyword parameters; a keyword missing from an overload is a type error for every caller that passes
it, so each overload must carry every keyword of the implementation, with the same default.
"""

import ast
import inspect
import json
import re
from pathlib import Path

import pytest

import hfbridge

ROOT = Path(__file__).resolve().parent.parent

# hfbridge/__init__.py's __all__ in 0.1 (the commit before the wings): these keep working.
NAMES_0_1 = [
    "GenerationTrace", "Hooks", "InputPos", "Layout", "ModelAdapter", "NotebookStreamer", "Recompute",
    "ReturnsCache", "Sampler", "StepTrace", "TokenStep", "build_processors", "compute_transition_scores",
    "explain_generation", "explain_step", "from_rows", "generate", "sample_step", "to_rows",
]
# 0.2: the names the README used to reach into private modules for.
NAMES_0_2 = ["accelerator_route", "crop_cache", "reorder_cache"]
# 0.3: the replay for RL (docs/rl.md).
NAMES_REPLAY = ["Replay", "replay"]
# compare decodings on the same draws
NAMES_COMPARE = ["compare_step", "compare_generation", "StepComparison", "GenerationComparison"]
# transformers' own `generate` running hfbridge (`model.generate(custom_generate=hfbridge.custom_generate)`).
NAMES_CUSTOM_GENERATE = ["custom_generate"]


def test_0_1_has_nineteen_names():
    assert len(NAMES_0_1) == len(set(NAMES_0_1)) == 19


@pytest.mark.parametrize("name", NAMES_0_1 + NAMES_0_2 + NAMES_REPLAY + NAMES_COMPARE + NAMES_CUSTOM_GENERATE)
def test_public_name_imports(name):
    namespace: dict = {}
    exec(f"from hfbridge import {name}", namespace)
    assert namespace[name] is getattr(hfbridge, name)
    assert name in hfbridge.__all__


def test_every_name_in_all_exists_and_is_documented():
    assert len(hfbridge.__all__) == len(set(hfbridge.__all__))
    assert all(getattr(hfbridge, name).__doc__ for name in hfbridge.__all__)


def test_public_objects_say_where_they_live():
    # a public name's module is a private one inside hfbridge: users import it from `hfbridge`
    for name in hfbridge.__all__:
        module = getattr(getattr(hfbridge, name), "__module__", "")
        assert module.startswith("hfbridge._"), (name, module)


def _generate_definitions() -> list[ast.FunctionDef]:
    tree = ast.parse((ROOT / "hfbridge" / "_generate" / "generate.py").read_text())
    return [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "generate"]


def _keywords(function: ast.FunctionDef) -> dict[str, str]:
    """Keyword-only parameter -> its default, as source text."""
    return {arg.arg: ast.unparse(default) for arg, default in zip(function.args.kwonlyargs,
                                                                   function.args.kw_defaults)
            if default is not None} | {arg.arg: "" for arg, default in zip(function.args.kwonlyargs,
                                                                            function.args.kw_defaults)
                                       if default is None}


def test_generate_has_three_overloads_and_one_implementation():
    definitions = _generate_definitions()
    overloads = [d for d in definitions if any(ast.unparse(dec) == "overload" for dec in d.decorator_list)]
    assert len(definitions) == 4 and len(overloads) == 3
    assert definitions[-1] not in overloads


def test_generate_overloads_carry_every_keyword_of_the_implementation():
    *overloads, implementation = _generate_definitions()
    expected = _keywords(implementation)
    positional = [arg.arg for arg in implementation.args.args]
    for number, overload in enumerate(overloads, 1):
        keywords = _keywords(overload)
        missing = sorted(set(expected) - set(keywords))
        assert not missing, f"overload {number} of generate lacks {missing}"
        extra = set(keywords) - set(expected)
        assert extra <= {"return_dict_in_generate"}, f"overload {number} has {sorted(extra)} the implementation lacks"
        for name, default in expected.items():
            if name != "generation_config":  # overload 1 narrows it to None: the tensor return
                assert keywords[name] == default, (number, name, keywords[name], default)
        assert [arg.arg for arg in overload.args.args] == positional
        assert overload.args.kwarg is not None and overload.args.kwarg.arg == "kwargs"


def test_the_runtime_signature_is_the_implementation():
    parameters = inspect.signature(hfbridge.generate).parameters
    assert {"check_every", "synced_gpus", "assistant_model"} <= set(parameters)


def _user_facing_code() -> dict[str, str]:
    """README.md and every notebook's code cells, by file name."""
    files = {"README.md": (ROOT / "README.md").read_text()}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        files[path.name] = "\n".join("".join(cell["source"]) for cell in cells)
    files["notebooks/README.md"] = (ROOT / "notebooks" / "README.md").read_text()
    return files


@pytest.mark.parametrize(("name", "text"), sorted(_user_facing_code().items()))
def test_user_facing_files_name_no_private_module(name, text):
    private = sorted(set(re.findall(r"hfbridge(?:\.\w+)*\._(?!_)\w+", text)))
    assert not private, f"{name} names private modules {private}; give what it needs a public name"


def test_generate_options_have_one_field_per_keyword_of_generate():
    from hfbridge._generate.options import GenerateOptions, option_names

    parameters = inspect.signature(hfbridge.generate).parameters
    keywords = [name for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert list(option_names()) == keywords
    for name in keywords:  # the same defaults
        assert getattr(GenerateOptions(), name) == parameters[name].default, name
    assert GenerateOptions().kwargs == {}


def test_the_strategy_table_has_a_row_per_mode_of_hf():
    from transformers.generation.configuration_utils import GenerationMode

    from hfbridge._generate.strategies import STRATEGIES

    # every mode of the installed transformers' table is a row: run, or refused with a reason
    assert {str(mode.value) for mode in GenerationMode} <= set(STRATEGIES)
    # docs/generate.md's table names every runner, read from the table (no list of them here)
    page = (ROOT / "docs" / "generate.md").read_text()
    table = page[page.index("## The strategy table"):page.index("**A new strategy**")]
    runners = {row.run.__name__ for row in STRATEGIES.values() if row.run is not None}
    assert {"run_loop", "run_beam", "run_assisted"} <= runners
    assert all(f"`{name}`" in table for name in runners), (runners, table)
    assert all(f"`{mode}`" in table for mode in STRATEGIES)
    assert all((row.run is None) == (row.refused is not None) for row in STRATEGIES.values())


def test_the_optional_vllm_wing_has_one_public_name_and_imports_without_vllm():
    import hfbridge.vllm

    assert hfbridge.vllm.__all__ == ["HFBridgeLogitsProcessor", "HFBridgeLogitsProcessorV2"]
    assert "hfbridge.vllm" not in hfbridge.__all__
