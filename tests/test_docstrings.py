"""Every module's docstring examples run and print what they show (new modules included, by discovery)."""

import doctest
import importlib
import pkgutil

import pytest

import hfbridge

MODULES = sorted(name for _, name, _ in pkgutil.walk_packages(hfbridge.__path__, prefix="hfbridge.")
                 if not name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0  # every module shows how it is used


def test_discovery_finds_the_modules():
    assert {"hfbridge._step.fast.fast_path", "hfbridge._models.adapters", "hfbridge._models.hooks", "hfbridge._step.fast.candidates"} <= set(MODULES)
