"""A tiny random HF model and a byte-level BPE tokenizer trained with `tokenizers`, saved to a folder,
and a local multiple-choice lm-eval task (YAML + JSONL) written next to them. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

EOS = "<|endoftext|>"
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A cat sat on the mat, and the dog barked at the cat.",
    "Question: what colour is the sky? Answer: blue.",
    "Numbers: one two three four five six seven eight nine ten.",
    "She sells sea shells by the sea shore; the shells she sells are surely sea shells.",
    "Paris is the capital of France. Berlin is the capital of Germany.",
]
CONTEXT = 64  # the model's n_positions: lm-eval's max_length


def save_tokenizer(folder: Path) -> None:
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token=EOS, eos_token=EOS)
    tokenizer.save_pretrained(folder)


def save_model(folder: Path, vocab: int) -> None:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).eval().save_pretrained(folder)


def save_task(folder: Path, name: str = "tiny_choice") -> str:
    """A multiple-choice task over a JSONL file; returns the task name."""
    rows = [
        {"question": "The capital of France is", "choices": [" Paris", " Berlin", " blue"], "label": 0},
        {"question": "The sky is", "choices": [" blue", " the cat", " seven"], "label": 0},
        {"question": "The quick brown fox jumps over the", "choices": [" lazy dog", " sea", " mat"], "label": 0},
        {"question": "One two three", "choices": [" four", " nine ten", " France"], "label": 0},
        {"question": "She sells sea", "choices": [" shells", " dog", " capital of Germany"], "label": 0},
        {"question": "A cat sat on the", "choices": [" mat", " sky", " five six"], "label": 0},
    ]
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: label\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    return name
