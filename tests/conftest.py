"""Fixtures shared by the tests (opted into per module with `pytestmark`), and the helpers' folder on sys.path."""

import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import settings
from transformers.utils import logging as hf_logging

# The tests live in folders that mirror the package's wings (step/, step/fast/, processors/, models/, hf/,
# generate/, views/, demo/); the house-wide checks (architecture, docs, public API) stay here; their
# shared helpers (_tiny_models, _zipf, _host_reads, _two_ranks) stay here and are imported as
# top-level modules (`from _tiny_models import ...`) from any folder.
TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

# The property tests draw the same examples on every run (CI must not turn red by the luck of a draw);
# HYPOTHESIS_PROFILE=explore draws new ones, for hunting bugs locally.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and the CI machine is shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def quiet_hf():
    """HF's log warnings (pad token defaults, deprecations) are the same on both sides; keep the log short."""
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    yield
    hf_logging.set_verbosity(verbosity)


@pytest.fixture
def no_python_warnings():
    """Python warnings off: these modules compare against HF, whose warnings are the same on both sides."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
