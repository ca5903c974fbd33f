"""A tiny random Llama saved offline for vLLM: safetensors weights and a `tokenizers` word-level tokenizer.

vLLM loads models from a folder, so the tests and `benchmarks/vllm.py` write one: nothing is downloaded.
vLLM's CPU attention needs a head size of at least 32.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 96
EOS = 2


def tokenizer(vocab_size: int = VOCAB) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over `<s>`, `<unk>`, `</s>` and the words `w3` ... `w95`, split on spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<s>": 0, "<unk>": 1, "</s>": EOS, **{f"w{i}": i for i in range(3, vocab_size)}}
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def model(vocab_size: int = VOCAB, max_positions: int = 512) -> LlamaForCausalLM:
    """The model, its weights drawn with seed 0 (float32); `max_positions`: the longest sequence vLLM allows."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=max_positions,
                         bos_token_id=0, eos_token_id=EOS, pad_token_id=None, tie_word_embeddings=False,
                         torch_dtype="float32")
    llama = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper logits than the default init, so that greedy paths differ by option
        llama.lm_head.weight.mul_(40.0)
    return llama


def save(folder: str | Path, vocab_size: int = VOCAB, max_positions: int = 512) -> Path:
    """Write the model and its tokenizer to `folder`; returns it."""
    folder = Path(folder)
    model(vocab_size, max_positions).save_pretrained(folder, safe_serialization=True)
    tokenizer(vocab_size).save_pretrained(folder)
    return folder


def prompts(count: int, *, seed: int = 1, low: int = 4, high: int = 12, vocab_size: int = VOCAB) -> list[list[int]]:
    """`count` prompts of token ids (no special tokens), of lengths in `[low, high)`."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (count,), generator=generator).tolist()
    return [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def shutdown(llm) -> None:
    """Stop an `LLM`'s engine processes now (not at interpreter exit, after pytest closed its streams)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()
