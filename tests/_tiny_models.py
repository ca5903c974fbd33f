"""Tiny models for the `generate` tests: random HF models built from configs, the wrappers that call
them the way HF's `generate` does (for each hfbridge model form), and small custom (non-HF) models.

Nothing is downloaded; every model is built from a config with a fixed seed.
"""

from __future__ import annotations

import inspect
import math

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB = 48


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=None, eos_token_id=None)
    return GPT2LMHeadModel(config).eval()


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


HF_MODELS = {"gpt2": tiny_gpt2, "llama": tiny_llama}


def model_cache():
    """A getter that builds each of `HF_MODELS` once, for one test module: `_model = model_cache()`."""
    built: dict = {}

    def model(name: str):
        if name not in built:
            built[name] = HF_MODELS[name]()
        return built[name]

    return model


def _keep_last_logits(hf) -> dict:
    """The `logits_to_keep=1` HF's `generate` passes (named `num_logits_to_keep` in 4.46)."""
    parameters = inspect.signature(hf.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in parameters:
            return {name: 1}
    return {}


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids from the mask, as HF's `generate` makes them (padding gets a dummy position)."""
    position_ids = attention_mask.long().cumsum(-1) - 1  # [B, T]
    return position_ids.masked_fill(attention_mask == 0, 1)


def recompute_callable(hf):
    """An HF model as a plain callable `model(input_ids, attention_mask) -> logits`, called as HF's
    `generate(use_cache=False)` calls it."""
    keep = _keep_last_logits(hf)

    def model(input_ids, attention_mask):
        return hf(input_ids, attention_mask=attention_mask, position_ids=positions(attention_mask),
                  use_cache=False, **keep).logits

    return model


def returns_cache_callable(hf):
    """An HF model as `model(input_ids, cache, attention_mask) -> (logits, cache)`."""
    keep = _keep_last_logits(hf)

    def model(input_ids, cache, attention_mask):
        position_ids = positions(attention_mask)[:, -input_ids.shape[1]:]
        out = hf(input_ids, past_key_values=cache, attention_mask=attention_mask, position_ids=position_ids,
                 use_cache=True, **keep)
        return out.logits, out.past_key_values

    return model


class InputPosHF(torch.nn.Module):
    """An HF model behind gpt-fast's interface, `model(idx, input_pos)`, with its cache inside."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf
        self.keep = _keep_last_logits(hf)
        self.cache = None

    def forward(self, idx, input_pos):
        if int(input_pos[0]) == 0:
            self.cache = None  # a new prompt
        position_ids = input_pos[None].expand(idx.shape[0], -1)
        out = self.hf(idx, past_key_values=self.cache, position_ids=position_ids, use_cache=True, **self.keep)
        self.cache = out.past_key_values
        return out.logits


# ---------------------------------------------------------------------------------------------
# Custom (non-HF) models: one causal self-attention layer, nanoGPT-shaped, in every model form.
# ---------------------------------------------------------------------------------------------


class TinyCore(torch.nn.Module):
    """Embeddings, one causal attention layer and a head; the forms below share its weights."""

    def __init__(self, vocab: int = 32, dim: int = 16, max_len: int = 64, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.vocab, self.dim, self.max_len = vocab, dim, max_len
        self.tok = torch.nn.Parameter(torch.randn(vocab, dim, generator=generator))
        self.pos = torch.nn.Parameter(torch.randn(max_len, dim, generator=generator) * 0.5)
        self.qkv = torch.nn.Parameter(torch.randn(dim, 3 * dim, generator=generator) / math.sqrt(dim))
        self.head = torch.nn.Parameter(torch.randn(dim, vocab, generator=generator) * 2 / math.sqrt(dim))

    def embed(self, idx, position_ids):  # [B, S], [B, S] -> [B, S, D]
        return self.tok[idx] + self.pos[position_ids]

    def project(self, x):  # [B, S, D] -> q, k, v each [B, S, D]
        return (x @ self.qkv).split(self.dim, dim=-1)

    def attend(self, x, q, k, v, allowed):  # allowed: [B, S, T] bool
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.dim)  # [B, S, T]
        att = att.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        return (x + att @ v) @ self.head  # [B, S, V]


def _allowed(query_pos, key_pos, key_mask):  # [B, S], [B, T], [B, T] -> [B, S, T]
    return (key_pos[:, None, :] <= query_pos[:, :, None]) & key_mask[:, None, :].bool()


class TinyRecompute(torch.nn.Module):
    """nanoGPT style: `model(idx) -> logits [B, T, V]`, the whole sequence every call."""

    def __init__(self, core: TinyCore):
        super().__init__()
        self.masked = TinyMasked(core)

    def forward(self, idx):
        return self.masked(idx, attention_mask=torch.ones_like(idx))


class TinyMasked(torch.nn.Module):
    """`model(idx, attention_mask) -> logits`: recomputes, and skips left padding."""

    def __init__(self, core: TinyCore):
        super().__init__()
        self.core = core

    def forward(self, idx, attention_mask):
        pos = positions(attention_mask)
        x = self.core.embed(idx, pos)
        q, k, v = self.core.project(x)
        order = torch.arange(idx.shape[1]).expand_as(idx)
        return self.core.attend(x, q, k, v, _allowed(order, order, attention_mask))


class TinyFast(torch.nn.Module):
    """gpt-fast style: `setup_caches(max_batch_size, max_seq_length)`, then `model(idx, input_pos)`."""

    def __init__(self, core: TinyCore):
        super().__init__()
        self.core = core
        self.calls: list[tuple[tuple[int, ...], list[int]]] = []

    def setup_caches(self, max_batch_size: int, max_seq_length: int) -> None:
        shape = (max_batch_size, max_seq_length, self.core.dim)
        self.k_cache, self.v_cache = torch.zeros(shape), torch.zeros(shape)

    def forward(self, idx, input_pos):  # idx [B, S], input_pos [S]
        self.calls.append((tuple(idx.shape), input_pos.tolist()))
        batch = idx.shape[0]
        pos = input_pos[None].expand(batch, -1)
        x = self.core.embed(idx, pos)
        q, k, v = self.core.project(x)
        self.k_cache[:batch, input_pos] = k
        self.v_cache[:batch, input_pos] = v
        key_pos = torch.arange(self.k_cache.shape[1])[None].expand(batch, -1)
        allowed = _allowed(pos, key_pos, torch.ones_like(key_pos))
        return self.core.attend(x, q, self.k_cache[:batch], self.v_cache[:batch], allowed)


class TinyCached(torch.nn.Module):
    """`model(idx, cache, attention_mask) -> (logits, cache)` with `cache = (k, v)` tensors."""

    def __init__(self, core: TinyCore):
        super().__init__()
        self.core = core

    def forward(self, idx, cache, attention_mask):
        new = idx.shape[1]
        pos = positions(attention_mask)[:, -new:]
        x = self.core.embed(idx, pos)
        q, k, v = self.core.project(x)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=1), torch.cat([cache[1], v], dim=1)
        order = torch.arange(attention_mask.shape[1]).expand_as(attention_mask)
        allowed = _allowed(order[:, -new:], order, attention_mask)
        return self.core.attend(x, q, k, v, allowed), (k, v)


# ---------------------------------------------------------------------------------------------
# A character-level tokenizer built locally with the `tokenizers` library.
# ---------------------------------------------------------------------------------------------

CHARS = list("abcdefghijklmnopqrstuvwxyz {}\":,0123456789.")


def every_model_form(core: TinyCore, rows: int, length: int) -> dict:
    """The four model forms over one `TinyCore` (its cache sized for `rows` x `length`): `Recompute`,
    `ReturnsCache`, `InputPos` and `Hooks`, by name."""
    from hfbridge import Hooks, InputPos, Recompute, ReturnsCache

    fast = TinyFast(core)
    fast.setup_caches(max_batch_size=rows, max_seq_length=length)

    def prepare_inputs(input_ids, *, attention_mask, cache=None):
        seen = 0 if cache is None else cache[0].shape[1]
        return {"idx": input_ids[:, seen:], "cache": cache, "attention_mask": attention_mask}

    def update_state(outputs, state):
        return {**state, "cache": outputs[1]}

    return {"recompute": Recompute(TinyMasked(core)), "returns_cache": ReturnsCache(TinyCached(core)),
            "input_pos": InputPos(fast), "hooks": Hooks(TinyCached(core), prepare_inputs, update_state)}


def char_tokenizer():
    """`<eos>`=0, `<pad>`=1, then one token per character of `CHARS` (45 tokens in all)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(["<eos>", "<pad>"] + CHARS)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")
