"""The shipped demo model, its tokenizer, its training script and `python -m hfbridge demo`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from hfbridge import Sampler
from hfbridge.__main__ import build_parser, main
from hfbridge.demo import DemoConfig, DemoLM, load_demo_model, load_demo_tokenizer
from hfbridge.demo._assets import ASSET_DIR
from hfbridge.demo.train import build_tokenizer, corpus_documents, train

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model():
    return load_demo_model()


@pytest.fixture(scope="module")
def tokenizer():
    return load_demo_tokenizer()


def test_assets_are_small_and_plain(model):
    assert (ASSET_DIR / "model.pt").stat().st_size < 4_000_000
    assert isinstance(model, torch.nn.Module) and not isinstance(model, PreTrainedModel)
    assert not model.training


def test_tokenizer_round_trip(tokenizer):
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    text = "def f(x):\n    return x  # ünïcode ─▶ works\n"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|pad|>"
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert len(tokenizer) == load_demo_model().config.vocab_size


def test_shipped_tokenizer_is_what_the_script_builds():
    built = json.loads(build_tokenizer(corpus_documents()).to_str())
    shipped = json.loads((ASSET_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    assert built["model"]["vocab"] == shipped["model"]["vocab"]
    assert built["model"]["merges"] == shipped["model"]["merges"]


def test_kv_cache_matches_full_forward(model, tokenizer):
    ids = tokenizer("The lighthouse keeper counted the ships", return_tensors="pt").input_ids  # [1, T]
    with torch.no_grad():
        full = model(ids)  # [1, T, V]
        cache = model.new_cache()
        first = model(ids[:, :3], cache=cache)
        rest = [model(ids[:, i : i + 1], cache=cache) for i in range(3, ids.shape[1])]
    stepwise = torch.cat([first, *rest], dim=1)
    assert cache.length == ids.shape[1]
    torch.testing.assert_close(stepwise, full, atol=1e-4, rtol=1e-4)


def test_left_padding_with_attention_mask(model, tokenizer):
    batch = tokenizer(["The cat", "Q: Can I stream the text?"], return_tensors="pt", padding=True)
    assert batch.input_ids[0, 0] == tokenizer.pad_token_id  # left padded
    with torch.no_grad():
        padded = model(batch.input_ids, attention_mask=batch.attention_mask)[0, -1]
        alone = model(tokenizer("The cat", return_tensors="pt").input_ids)[0, -1]
    torch.testing.assert_close(padded, alone, atol=1e-4, rtol=1e-4)


def test_errors_name_the_argument(model):
    with pytest.raises(ValueError, match="block_size=256"):
        model(torch.zeros(1, 257, dtype=torch.long))
    with pytest.raises(ValueError, match="idx"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 4))


def _continue(model, tokenizer, prompt, steps, **options):
    """Decode with the KV cache and a `Sampler`: one forward pass per new token."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids  # [1, T]
    sampler = Sampler(**options)
    cache = model.new_cache()
    with torch.no_grad():
        logits = model(ids, cache=cache)
        for _ in range(steps):
            token = sampler(logits, ids)  # [1]
            ids = torch.cat([ids, token[:, None]], dim=1)
            logits = model(token[:, None], cache=cache)
    return tokenizer.decode(ids[0])


def test_greedy_text_is_pinned(model, tokenizer):
    # The shipped weights know the corpus: greedy decoding recites a familiar sentence.
    assert _continue(model, tokenizer, "The lighthouse keeper", 12) == "The lighthouse keeper counted the ships every nig"


def test_sampled_text_is_made_of_words(model, tokenizer):
    corpus_words = set(re.findall(r"[A-Za-z]+", " ".join(corpus_documents())))
    words = []
    for seed, prompt in enumerate(["The model", "The cat", "Q: What is top-p?\nA:"]):
        text = _continue(model, tokenizer, prompt, 50, temperature=0.8, top_p=0.9,
                         generator=torch.Generator().manual_seed(seed))
        words += re.findall(r"[A-Za-z]+", text[len(prompt):])
    # Not noise: most of what it writes are words it read (a random model scores near 0).
    assert len(words) >= 40
    assert sum(w in corpus_words for w in words) / len(words) > 0.7


def test_training_is_reproducible(tmp_path):
    tiny = DemoConfig(n_layer=1, n_embd=16, n_head=2, block_size=32)
    a = train(steps=2, batch_size=2, context=16, out_dir=tmp_path / "a", config=tiny, log_every=10)
    b = train(steps=2, batch_size=2, context=16, out_dir=tmp_path / "b", config=tiny, log_every=10)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    reloaded = torch.load(tmp_path / "a" / "model.pt", weights_only=True)
    assert reloaded["config"]["n_layer"] == 1 and isinstance(DemoLM(DemoConfig(**reloaded["config"])), DemoLM)


def test_demo_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    demo = build_parser()._subparsers._group_actions[0].choices["demo"]
    for action in demo._actions:
        for flag in action.option_strings:
            assert flag in help_text
        assert action.help, action.dest


def test_demo_rejects_too_many_tokens(capsys):
    assert main(["demo", "--max-new-tokens", "300"]) == 2
    assert "--max-new-tokens=300" in capsys.readouterr().err


def test_demo_rejects_bad_settings_before_streaming(capsys):
    assert main(["demo", "--top-p", "1.5"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "`top_p`=1.5" in captured.err


def test_demo_command_runs_offline_with_bounded_output():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "hfbridge", "demo", "--max-new-tokens", "24", "--prompt", "The cat"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert len(out) < 6000 and out.count("\n") < 80
    for header in ("--- greedy ---", "--- temperature=0.8, top_p=0.9 ---", "--- repetition_penalty=1.3 (greedy) ---"):
        assert header in out
    for name in ("RepetitionPenaltyLogitsProcessor", "TemperatureLogitsWarper", "TopPLogitsWarper", "<- chosen"):
        assert name in out
    assert out.count("The cat") >= 3  # each setting streams the prompt and its continuation


@pytest.mark.parametrize("module", ["hfbridge.demo", "hfbridge.demo._model", "hfbridge.demo._assets", "hfbridge.demo.train"])
def test_docstring_examples(module):
    import doctest
    import importlib

    failures, tried = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0
