"""Every module's docstring examples run and print what they show (new modules included, by discovery)."""

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import hfbridge
from hfbridge._hf import names

MODULES = sorted(name for _, name, _ in pkgutil.walk_packages(hfbridge.__path__, prefix="hfbridge.")
                 if not name.endswith("__main__"))


# Modules that import an optional package at module level: their examples run where it is installed
# (asked by a module of the package: `tests/vllm` alone could pass for a namespace package `vllm`).
NEEDS = {"hfbridge.vllm.processor_v1": "vllm.v1.sample", "hfbridge.vllm.processor_v2": "vllm.v1.worker.gpu.sample",
         "hfbridge.sglang.logit_processor": "sglang.srt.sampling"}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


# Modules whose examples need a newer transformers than the oldest supported (its release, as a tuple).
TRANSFORMERS_AT_LEAST = {"hfbridge._generate.custom_generate": (4, 57)}  # `generate(custom_generate=<callable>)`


# Optional subpackages and what they need: their modules are tested where that is installed.
OPTIONAL = {"hfbridge.lm_eval": "lm_eval.api"}  # lm_eval.api: tests/lm_eval is a namespace package "lm_eval" on sys.path


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name in NEEDS and not _installed(NEEDS[name]):
        pytest.skip(f"{NEEDS[name].partition('.')[0]} is not installed")
    if name in TRANSFORMERS_AT_LEAST and names.TRANSFORMERS_VERSION[:2] < TRANSFORMERS_AT_LEAST[name]:
        pytest.skip(f"its examples need transformers {'.'.join(map(str, TRANSFORMERS_AT_LEAST[name]))} or newer")
    for package, requirement in OPTIONAL.items():
        if name == package or name.startswith(package + "."):
            pytest.importorskip(requirement)
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0  # every module shows how it is used


def test_discovery_finds_the_modules():
    assert {"hfbridge._step.fast.fast_path", "hfbridge._models.adapters", "hfbridge._models.hooks", "hfbridge._step.fast.candidates"} <= set(MODULES)
