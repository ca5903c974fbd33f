"""Shared pieces of the lm-eval tests (each module skips itself when lm-eval is not installed)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from transformers import AutoTokenizer, GPT2LMHeadModel

from _lm_eval_fixtures import save_model, save_task, save_tokenizer


@pytest.fixture(scope="session")
def folder(tmp_path_factory):
    """The tokenizer, the model and the task, saved once."""
    path = tmp_path_factory.mktemp("tiny_lm")
    save_tokenizer(path)
    save_model(path, len(AutoTokenizer.from_pretrained(path)))
    save_task(path)
    return path


@pytest.fixture(scope="session")
def hf_model(folder):
    return GPT2LMHeadModel.from_pretrained(folder).eval()


@pytest.fixture
def tokenizer(folder):
    """A fresh tokenizer per use: HFLM sets a pad token on the one it gets."""
    return AutoTokenizer.from_pretrained(folder)
