"""A tiny byte-level GPT: the kind of home-grown model hfbridge is for.

It is deliberately *not* a ``transformers.PreTrainedModel``: a plain ``nn.Module`` whose
``forward`` returns logits, with an optional in-place KV cache (gpt-fast style) so the
notebooks can show both the full-recompute and the stateful way of calling a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

__all__ = ["DemoConfig", "DemoLM", "KVCache"]


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of a :class:`DemoLM`.

    Args:
        vocab_size: Number of token ids. Default: ``512``.
        block_size: Longest sequence the position table covers: the longest prompt, and the
            longest context; a :class:`KVCache` slides past it. Default: ``256``.
        n_layer: Number of transformer blocks. Default: ``4``.
        n_head: Attention heads per block; must divide ``n_embd``. Default: ``4``.
        n_embd: Width of the residual stream. Default: ``128``.
        dropout: Dropout rate of the embeddings and residual branches while training. Default: ``0.0``.

    >>> DemoConfig(n_layer=2).n_layer
    2
    """

    vocab_size: int = 512
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, for saving next to the weights."""
        return asdict(self)


class KVCache:
    """Keys and values of every layer for the tokens seen so far; grows in place.

    Create one with :meth:`DemoLM.new_cache` and pass it to every call; each call appends the
    keys and values of its new tokens, so the next call only feeds the newest token. When it is
    full (``block_size`` positions, the most the model's position table covers), the model slides
    it: the oldest half is dropped and the newest half computed again at positions from 0 (learned
    positions cannot be shifted in place), so a generation through the cache can be of any length,
    each token seeing between half a block and a block of context. ``start`` counts the positions
    dropped so far.

    Assisted decoding and banned strings take positions back: :meth:`crop` keeps the first ``length``
    positions of the sequence, whether or not the cache slid since (hfbridge calls it for you through
    ``ReturnsCache(model.forward_cached)``).

    >>> model = DemoLM(DemoConfig(n_layer=1, n_embd=16, n_head=2, vocab_size=8, block_size=8))
    >>> cache = model.new_cache()
    >>> _ = model(torch.tensor([[1, 2, 3]]), cache=cache)
    >>> cache.length
    3
    """

    def __init__(self, n_layer: int, block_size: int = 256) -> None:
        self.block_size = block_size  # the model's; a crop to before `start` computes half of it again
        self.keys: list[torch.Tensor | None] = [None] * n_layer  # each [B, H, S, D]
        self.values: list[torch.Tensor | None] = [None] * n_layer
        self.ids: torch.Tensor | None = None  # [B, S]: the tokens of the cached positions, to slide
        self.start = 0  # positions of the sequence dropped from the front
        self.dropped: torch.Tensor | None = None  # [B, start]: their tokens, for a crop to before `start`
        self.pending: torch.Tensor | None = None  # [B, P]: tokens the next call computes again first

    def restart(self, start: int) -> None:
        """Empty the cache, whose next position is ``start`` of the sequence."""
        self.keys = [None] * len(self.keys)
        self.values = [None] * len(self.values)
        self.ids, self.start, self.pending = None, start, None

    def crop(self, length: int) -> KVCache:
        """Keep the first ``length`` positions of the sequence; returns this cache, cropped in place.

        A ``length`` after :attr:`start` cuts the stored keys, values and ids. One at or before it (the
        positions were slid out) empties the cache and has the next call compute the last half block
        before ``length`` again from position 0, as a slide does.

        >>> model = DemoLM(DemoConfig(n_layer=1, n_embd=16, n_head=2, vocab_size=8, block_size=8))
        >>> cache = model.new_cache()
        >>> _ = model(torch.tensor([[1, 2, 3, 4, 5]]), cache=cache)
        >>> cache.crop(3).length, cache.ids
        (3, tensor([[1, 2, 3]]))
        """
        held = self.pending if self.pending is not None else self.ids  # [B, S]: after `start`
        if held is None or length >= self.start + held.shape[1]:
            return self
        if self.pending is None and length > self.start:
            kept = length - self.start
            self.keys = [None if k is None else k[:, :, :kept] for k in self.keys]
            self.values = [None if v is None else v[:, :, :kept] for v in self.values]
            self.ids = held[:, :kept]
            return self
        seen = held if self.dropped is None else torch.cat([self.dropped, held], dim=1)  # [B, start + S]
        first = max(length - self.block_size // 2, 0)
        self.restart(first)
        self.dropped = seen[:, :first] if first else None
        self.pending = seen[:, first:length] if length > first else None
        return self

    @property
    def length(self) -> int:
        """Number of positions already stored."""
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this call's ``k``/``v`` [B, H, T, D] to ``layer`` and return the full ones."""
        past_k, past_v = self.keys[layer], self.values[layer]
        if past_k is not None and past_v is not None:
            k = torch.cat([past_k, k], dim=2)
            v = torch.cat([past_v, v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class _Block(nn.Module):
    def __init__(self, config: DemoConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_head = config.n_head
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd),
            nn.GELU(),
            nn.Linear(4 * config.n_embd, config.n_embd),
            nn.Dropout(config.dropout),
        )
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        # x: [B, T, C]; mask: [B, 1, T, S] (True = may attend), S = cached + T
        q, k, v = rearrange(self.qkv(self.ln_1(x)), "b t (three h d) -> three b h t d", three=3, h=self.n_head)
        if cache is not None:
            k, v = cache.extend(self.layer, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.drop(self.proj(rearrange(y, "b h t d -> b t (h d)")))
        return x + self.mlp(self.ln_2(x))


class DemoLM(nn.Module):
    """A small decoder-only transformer over byte-level BPE tokens.

    Call it with token ids ``[B, T]`` and get logits ``[B, T, V]``. With ``cache=`` only the
    new tokens are fed and earlier positions are read from the cache. ``attention_mask``
    (``[B, S]``, 1 for real tokens, 0 for left padding, covering cached plus new positions)
    makes a left-padded batch give each row the same logits it would get alone.
    :meth:`forward_cached` is the same cached call returning ``(logits, cache)``, the form
    ``hfbridge.ReturnsCache`` drives.

    Args:
        config: Sizes. Default: ``DemoConfig()``.

    >>> model = DemoLM(DemoConfig(n_layer=1, n_embd=16, n_head=2, vocab_size=8, block_size=8))
    >>> model(torch.tensor([[1, 2, 3]])).shape
    torch.Size([1, 3, 8])
    """

    def __init__(self, config: DemoConfig | None = None) -> None:
        super().__init__()
        self.config = config or DemoConfig()
        c = self.config
        if c.n_embd % c.n_head:
            raise ValueError(f"n_embd={c.n_embd} must be a multiple of n_head={c.n_head}")
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_emb = nn.Embedding(c.block_size, c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(_Block(c, i) for i in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def new_cache(self) -> KVCache:
        """An empty :class:`KVCache` for this model."""
        return KVCache(self.config.n_layer, self.config.block_size)

    def forward_cached(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KVCache]:
        """``(logits, cache)``: the functional form of the cached call, for ``hfbridge.ReturnsCache``.

        With ``cache=None`` a new cache is started. The returned cache is the same object,
        extended in place, so pass it back with the next call's new tokens.

        >>> model = DemoLM(DemoConfig(n_layer=1, n_embd=16, n_head=2, vocab_size=8, block_size=8))
        >>> logits, cache = model.forward_cached(torch.tensor([[1, 2]]))
        >>> logits, cache = model.forward_cached(torch.tensor([[3]]), cache)
        >>> logits.shape, cache.length
        (torch.Size([1, 1, 8]), 3)
        """
        cache = self.new_cache() if cache is None else cache
        return self(idx, cache=cache, attention_mask=attention_mask), cache

    def forward(
        self,
        idx: torch.Tensor,
        *,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[B, T, V]`` for token ids ``idx`` ``[B, T]``; see the class docstring.

        With a ``cache`` that has slid (``cache.start > 0``), ``attention_mask`` may cover the whole
        sequence (``cache.start`` + cached + new positions) or the cached and new ones only.
        """
        if idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(f"idx: expected a [batch, time] long tensor, got {idx.dtype} of shape {tuple(idx.shape)}")
        if cache is not None and cache.pending is not None:  # cropped to before a slide: compute them again
            pending, cache.pending, new = cache.pending, None, idx.shape[1]
            return self(torch.cat([pending, idx], dim=1), cache=cache, attention_mask=attention_mask)[:, -new:]
        batch, new = idx.shape
        past = 0 if cache is None else cache.length
        block = self.config.block_size
        if cache is not None and cache.start and attention_mask is not None \
                and attention_mask.shape[-1] == cache.start + past + new:
            attention_mask = attention_mask[:, cache.start:]  # the whole sequence's mask: the cached part on
        if cache is not None and past and past + new > block and new <= block:
            return self._slide(idx, cache, attention_mask)
        total = past + new
        if total > block and cache is None:
            raise ValueError(
                f"idx: {new} positions exceed block_size={block}, the positions the model learned; for a longer "
                "generation call it through its KV cache, which slides: generate(ReturnsCache(model.forward_cached), "
                "...) (ReturnsCache is hfbridge's)"
            )
        if total > block:
            raise ValueError(
                f"idx: {past} cached + {new} new positions exceed block_size={block}; a prompt (or one call's new "
                f"tokens) must fit in {block} positions"
            )
        if attention_mask is None:
            attention_mask = torch.ones(batch, total, dtype=torch.long, device=idx.device)
        elif tuple(attention_mask.shape) != (batch, total):
            raise ValueError(
                f"attention_mask: expected shape {(batch, total)} (cached + new positions), "
                f"got {tuple(attention_mask.shape)}"
            )
        keep = attention_mask.bool()
        # Left padding shifts real tokens right; count positions from each row's first real token.
        positions = (keep.long().cumsum(-1) - 1).clamp_min(0)[:, past:]  # [B, T]
        query_at = torch.arange(past, total, device=idx.device)[:, None]  # [T, 1]
        key_at = torch.arange(total, device=idx.device)[None, :]  # [1, S]
        mask = (key_at <= query_at) & keep[:, None, :]  # [B, T, S]
        # A padding query would see no key at all and give NaN; let it see itself.
        mask = mask | (key_at == query_at)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(positions))
        for layer in self.blocks:
            x = layer(x, mask[:, None], cache)
        if cache is not None:
            cache.ids = idx if cache.ids is None else torch.cat([cache.ids, idx], dim=1)  # [B, S]
        return self.ln_f(x) @ self.tok_emb.weight.T  # tied output head

    def _slide(self, idx: torch.Tensor, cache: KVCache, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The full cache's oldest half dropped, the newest half and ``idx`` computed again from position 0."""
        new = idx.shape[1]
        assert cache.ids is not None  # recorded by every cached call
        seen = torch.cat([cache.ids, idx], dim=1)  # [B, S + T]
        keep = max(self.config.block_size // 2, new)
        if attention_mask is not None:
            if attention_mask.shape[-1] != seen.shape[1]:
                raise ValueError(
                    f"attention_mask: expected {seen.shape[1]} columns (cached + new positions) or "
                    f"{cache.start + seen.shape[1]} (the whole sequence), got {tuple(attention_mask.shape)}"
                )
            attention_mask = attention_mask[:, -keep:]
        history = seen if cache.dropped is None else torch.cat([cache.dropped, seen], dim=1)  # [B, start + S + T]
        cache.restart(cache.start + seen.shape[1] - keep)
        cache.dropped = history[:, :cache.start]
        return self(seen[:, -keep:], cache=cache, attention_mask=attention_mask)[:, -new:]  # [B, T, V]
