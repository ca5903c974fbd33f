"""The shipped demo model, its tokenizer, its training script and `python -m hfbridge demo`."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from hfbridge import ReturnsCache, Sampler, generate
from hfbridge.__main__ import build_parser, main
from hfbridge.demo import DemoConfig, DemoLM, load_demo_model, load_demo_tokenizer
from hfbridge.demo._assets import ASSET_DIR
from hfbridge.demo._stories import stories
from hfbridge.demo.train import DEFAULT_CONFIG, build_tokenizer, corpus_documents, train

REPO = Path(__file__).resolve().parents[2]
PINNED_GREEDY = "The lighthouse keeper wanted to give the baker a present."


@pytest.fixture(scope="module")
def model():
    return load_demo_model()


@pytest.fixture(scope="module")
def tokenizer():
    return load_demo_tokenizer()


def test_assets_are_small_and_plain(model):
    assert (ASSET_DIR / "model.pt").stat().st_size < 5_000_000
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


SENTENCE_END = re.compile(r"[.!?][\"']?$")


def test_greedy_text_is_pinned(model, tokenizer):
    # The shipped weights know the corpus: greedy decoding tells a whole little story.
    text = _continue(model, tokenizer, "The lighthouse keeper", 8)
    assert text == PINNED_GREEDY


@pytest.mark.parametrize("prompt", ["The lighthouse keeper", "The little robot", "The train", "Once upon a time"])
def test_greedy_story_ends_with_a_sentence_and_eos(model, tokenizer, prompt):
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = generate(ReturnsCache(model.forward_cached), ids, max_new_tokens=200, eos_token_id=tokenizer.eos_token_id)
    assert out[0, -1] == tokenizer.eos_token_id  # the model ended the story itself
    text = tokenizer.decode(out[0], skip_special_tokens=True).strip()
    assert SENTENCE_END.search(text), text
    corpus_words = set(re.findall(r"[A-Za-z]+", " ".join(corpus_documents())))
    assert set(re.findall(r"[A-Za-z]+", text)) <= corpus_words, text  # no broken words


def test_sampled_text_is_made_of_words(model, tokenizer):
    corpus_words = set(re.findall(r"[A-Za-z]+", " ".join(corpus_documents())))
    words = []
    for seed, prompt in enumerate(["The model", "The cat", "Q: What is top-p?\nA:"]):
        text = _continue(model, tokenizer, prompt, 50, temperature=0.8, top_p=0.9,
                         generator=torch.Generator().manual_seed(seed))
        words += re.findall(r"[A-Za-z]+", text[len(prompt):])
    # Not noise: most of what it writes are words it read (a random model scores near 0).
    assert len(words) >= 40
    assert sum(w in corpus_words for w in words) / len(words) > 0.9


def test_training_is_reproducible(tmp_path):
    tiny = DemoConfig(vocab_size=300, n_layer=1, n_embd=16, n_head=2, block_size=32)
    a = train(steps=2, batch_size=2, context=16, out_dir=tmp_path / "a", config=tiny, log_every=10, story_count=20)
    b = train(steps=2, batch_size=2, context=16, out_dir=tmp_path / "b", config=tiny, log_every=10, story_count=20)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    assert (tmp_path / "a" / "model.pt").read_bytes() == (tmp_path / "b" / "model.pt").read_bytes()
    reloaded = torch.load(tmp_path / "a" / "model.pt", weights_only=True)
    assert reloaded["config"]["n_layer"] == 1 and isinstance(DemoLM(DemoConfig(**reloaded["config"])), DemoLM)


def test_shipped_weights_come_from_the_default_run(model):
    checkpoint = torch.load(ASSET_DIR / "model.pt", weights_only=True)
    assert checkpoint["config"] == DEFAULT_CONFIG.to_dict()
    assert checkpoint["seed"] == 0 and checkpoint["steps"] == inspect.signature(train).parameters["steps"].default
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # stored as float16, loaded as float32


def test_stories_are_plain_sentences():
    tales = stories(300)
    assert tales == stories(300) and tales != stories(300, seed=1)
    for tale in tales:
        assert tale.endswith("\n") and tale.count("\n") == 1
        assert SENTENCE_END.search(tale.rstrip()), tale
        assert "  " not in tale and " ," not in tale and " ." not in tale


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
    assert main(["demo", "--prompt", ""]) == 2
    assert "--prompt" in capsys.readouterr().err


def _blocks(out: str) -> dict[str, str]:
    """The demo's output split at its `--- title ---` lines."""
    parts = re.split(r"^--- (.*) ---$", out, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_demo_command_runs_offline_and_shows_its_code():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "hfbridge", "demo"], check=False, capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    blocks = _blocks(result.stdout)
    assert list(blocks) == [
        "setup", "greedy", "sampling: temperature=0.8, top_p=0.9", "the same sampling, stopped at the first '.' by stop_strings",
        "the promise: the very tokens of transformers' own processors and torch.multinomial",
        "what each processor did to the first step",
    ]
    for title in list(blocks)[1:4]:
        code, *text = blocks[title].strip().splitlines()
        assert code.startswith(">>> out = generate(cached, ids, ") and "streamer=stream" in code
        story = "\n".join(text).strip()
        assert story.startswith("The lighthouse keeper ") and SENTENCE_END.search(story), story
        assert "[cut at" not in story
    stopped = blocks[list(blocks)[3]].strip().splitlines()[-1]
    assert stopped.count(".") == 1 and blocks[list(blocks)[2]].strip().splitlines()[1].startswith(stopped)
    assert "\nidentical: True\n" in blocks[list(blocks)[4]]
    assert "TopPLogitsWarper(0.9)" in blocks[list(blocks)[4]]
    assert "<- chosen" in blocks[list(blocks)[5]]


def test_demo_promise_holds_for_other_settings(capsys):
    grad_enabled, threads = torch.is_grad_enabled(), torch.get_num_threads()
    assert main(["demo", "--prompt", "The cat", "--temperature", "1.0", "--top-p", "1.0", "--repetition-penalty", "1.0",
                 "--seed", "3", "--max-new-tokens", "40", "--explain-top", "0"]) == 0
    out = capsys.readouterr().out
    assert "LogitsProcessorList([TopKLogitsWarper(50)])" in out and "identical: True" in out
    assert "what each processor did" not in out
    assert (torch.is_grad_enabled(), torch.get_num_threads()) == (grad_enabled, threads)  # restored


@pytest.mark.parametrize(
    "module", ["hfbridge.demo", "hfbridge.demo._model", "hfbridge.demo._assets", "hfbridge.demo._stories", "hfbridge.demo.train"]
)
def test_docstring_examples(module):
    import doctest
    import importlib

    failures, tried = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0
