"""Model adapters: how `generate` calls your model at each step.

A model is anything callable that returns logits. What differs between models is what they take
at each step, and what they carry from one step to the next:

| adapter | calls | per step it feeds |
| --- | --- | --- |
| `Recompute` (any plain callable) | `model(input_ids[, attention_mask=...])` | the whole sequence (or its last `max_context` tokens) |
| `InputPos` (gpt-fast) | `model(idx, input_pos)` | the prompt once, then the new token; the cache lives in the model |
| `ReturnsCache` | `model(input_ids, cache) -> (logits, cache)` | the prompt once, then the new token and the returned cache |
| `Hooks` | `model(**prepare_inputs(input_ids, **state))` | whatever your hooks say (HF's `prepare_inputs_for_generation` / `_update_model_kwargs_for_generation`) |

Every adapter keeps a per-call `state` dict. `generate` owns one entry, `"attention_mask"`, the
`(batch, seq)` mask of the whole sequence so far (prompt padding as 0, every generated token as
1); the keyword arguments of `generate` that are not generation options start in it too, as model
inputs (after `num_return_sequences` expansion, as in HF).

>>> import torch
>>> from hfbridge import Recompute, generate
>>> table = torch.randn(8, 8)
>>> def bigram(input_ids):                                  # [B, T] -> [B, T, V]
...     return table[input_ids]
>>> generate(Recompute(bigram, max_context=1), torch.tensor([[3]]), max_new_tokens=2).shape
torch.Size([1, 3])
"""  # noqa: E501 (the table rows)

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from hfbridge._models.callables import (
    accepts,
    call_signature,
    checked_hook,
    parameter_list,
)

# Keys the built-in adapters keep in the state for themselves.
_FED = "_fed"  # how many tokens of the sequence the model has already seen (its cache length)
_CACHE = "_cache"  # the cache a `ReturnsCache` model returned last
_STILL = "_still"  # a cache tensor whose sequence axis did not grow at the last call (`not_growing`)


class ModelAdapter:
    """Base class of the adapters: how one model is called and what it carries between steps.

    `generate` calls `start` once, then at every step `forward` (the model call) and `update`
    (carry outputs forward), and hands `logits(outputs)` to the sampling step.

    Subclass it for a calling convention the four adapters do not cover: override `forward`, and
    `update` / `logits` / `cache` where needed (`state` is a dict; keys starting with `_` are the
    adapter's own, the others are model inputs), and `reorder_cache` when the adapter carries a
    cache and you use beam search.

    Args:
        model: The model: any callable (an `nn.Module`, a function, a compiled module).

    >>> import torch
    >>> from hfbridge import ModelAdapter, generate
    >>> class EveryOther(ModelAdapter):               # a toy: the model sees every other token
    ...     def forward(self, input_ids, state):
    ...         return self.model(input_ids[:, ::2])
    >>> table = torch.randn(8, 8)
    >>> generate(EveryOther(lambda ids: table[ids]), torch.tensor([[1, 2, 3]]), max_new_tokens=2).shape
    torch.Size([1, 5])
    """

    #: Model inputs that the adapter itself supplies; `generate` keyword arguments may not use them.
    reserved: tuple[str, ...] = ()

    def __init__(self, model: Callable[..., Any]):
        if isinstance(model, ModelAdapter):
            raise TypeError(
                f"`model` is already a {type(model).__name__} adapter; pass the model itself to "
                f"{type(self).__name__}(...)."
            )
        if not callable(model):
            raise TypeError(f"`model` must be callable (an nn.Module or a function), got {type(model).__name__}.")
        self.model = model
        self.signature = call_signature(model)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self.model, '__name__', type(self.model).__name__)})"

    def check_inputs(self, names: list[str]) -> None:
        """Raise `TypeError` when the model cannot take the model inputs `names` as keywords."""
        for name in names:
            if name in self.reserved:
                raise TypeError(
                    f"generate() got the model input `{name}`, but {type(self).__name__} supplies `{name}` itself; "
                    "remove it from the call."
                )
            if not accepts(self.signature, name):
                raise TypeError(
                    f"generate() got `{name}`, which is neither a generation option nor an input the model accepts "
                    f"(the model's parameters: {parameter_list(self.signature)})."
                )

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              model_inputs: dict[str, Any]) -> dict[str, Any]:
        """The state before the first call: the mask, the model inputs and the adapter's own entries."""
        self.check_inputs(list(model_inputs))
        return {"attention_mask": attention_mask, **model_inputs, _FED: 0}

    def forward(self, input_ids: torch.Tensor, state: dict[str, Any]) -> Any:
        """Call the model for the next token of every row of `input_ids` `(batch, seq)`."""
        raise NotImplementedError

    def update(self, outputs: Any, input_ids: torch.Tensor, state: dict[str, Any]) -> dict[str, Any]:
        """The state after the model returned `outputs` for the sequence `input_ids`."""
        state[_FED] = input_ids.shape[1]
        return state

    def logits(self, outputs: Any) -> Any:
        """The logits-like part of `outputs` (a tensor, tuple, mapping or `ModelOutput`)."""
        return outputs

    def cache(self, state: dict[str, Any]) -> Any:
        """The cache to return in `GenerateDecoderOnlyOutput` (`past_key_values`, `cache` since 5.24), if any."""
        return None

    def reorder_cache(self, state: dict[str, Any], beam_idx: torch.Tensor) -> dict[str, Any]:
        """The state after beam search continued row `i` from row `beam_idx[i]` (`beam_idx`: `(rows,)`).

        Called after every beam search step. The default has nothing to reorder (a model that
        recomputes the whole sequence); override it when your adapter carries a cache in `state`
        (`hfbridge.reorder_cache` handles HF `Cache` objects and batch-first tensor nests).
        """
        return state

    def check_reorder(self) -> None:
        """Raise `TypeError` before the first model call when beam search cannot follow this model's cache."""

    def check_crop(self, state: dict[str, Any]) -> None:
        """Raise `TypeError` when `crop` could not roll back this state (checked after the first call)."""

    def crop(self, state: dict[str, Any], length: int) -> dict[str, Any]:
        """The state once the model has forgotten every position from `length` on.

        Assisted and prompt-lookup decoding feed several draft tokens at once and roll back the
        rejected ones: the next `forward` must continue from `length` tokens. Override it in an
        adapter of your own (return the state unchanged when the model recomputes everything).
        """
        raise TypeError(
            f"{type(self).__name__} does not say how to drop positions from its model's cache, which assisted and "
            "prompt-lookup decoding need; override crop(state, length) (return the state unchanged if the model "
            "recomputes the whole sequence)."
        )

    @staticmethod
    def model_inputs(state: dict[str, Any]) -> dict[str, Any]:
        """The extra model inputs in `state` (everything but the mask and the adapter's own keys)."""
        return {k: v for k, v in state.items() if k != "attention_mask" and not k.startswith("_")}


class Recompute(ModelAdapter):
    """A plain callable that recomputes the whole sequence at every step (nanoGPT, minGPT, ...).

    Each step calls `model(input_ids, **model_inputs)` with the whole sequence so far, `(batch, seq)`,
    and uses the logits of its last position. When the model's signature names an `attention_mask`
    parameter it also receives `attention_mask=`, the `(batch, seq)` mask of the whole sequence
    (0 on left padding). Passing a plain callable to `generate` wraps it in `Recompute`.

    Args:
        model: `model(input_ids, ...) -> logits`; logits `(batch, seq, vocab)` by default (see
            `generate`'s `layout=` for others), or a tuple / mapping / `ModelOutput` holding them.
        max_context: Feed at most the last `max_context` tokens (and mask columns), for models
            with a fixed context window (nanoGPT's `block_size`). Default: the whole sequence.

    >>> import torch
    >>> from hfbridge import Recompute, generate
    >>> head = torch.nn.Linear(4, 10)
    >>> def model(input_ids):                    # [B, T] -> [B, T, V]
    ...     features = torch.nn.functional.one_hot(input_ids % 4, 4).float()
    ...     return head(features)
    >>> out = generate(Recompute(model, max_context=8), torch.tensor([[1, 2, 3]]), max_new_tokens=4)
    >>> out.shape
    torch.Size([1, 7])
    """

    def __init__(self, model: Callable[..., Any], *, max_context: int | None = None):
        super().__init__(model)
        if max_context is not None and (
            not isinstance(max_context, int) or isinstance(max_context, bool) or max_context < 1
        ):
            raise ValueError(f"`max_context` must be a positive int (the model's context window), got {max_context!r}.")
        self.max_context = max_context
        self.takes_mask = accepts(self.signature, "attention_mask", explicitly=True)

    def forward(self, input_ids: torch.Tensor, state: dict[str, Any]) -> Any:
        kwargs = self.model_inputs(state)
        ids = input_ids  # [B, T]
        mask = state["attention_mask"]  # [B, T]
        if self.max_context is not None:
            ids, mask = ids[:, -self.max_context:], mask[:, -self.max_context:]
        if self.takes_mask:
            kwargs["attention_mask"] = mask
        return self.model(ids, **kwargs)

    def crop(self, state: dict[str, Any], length: int) -> dict[str, Any]:
        state[_FED] = min(state.get(_FED, 0), length)  # nothing to forget: every call recomputes
        return state


class InputPos(ModelAdapter):
    """A gpt-fast style model with an internal KV cache: `model(idx, input_pos) -> logits`.

    The first call feeds the prompt, `idx` `(batch, prompt_len)` with `input_pos = arange(prompt_len)`;
    each later call feeds only the new token, `idx` `(batch, 1)` with `input_pos = tensor([position])`,
    exactly as gpt-fast's `prefill` / `decode_one_token`. Set up the model's caches before calling
    `generate` (gpt-fast: `model.setup_caches(max_batch_size, max_seq_length)`). Such models take no
    attention mask, so left-padded batches are refused: use `ReturnsCache` or `Hooks` for those.

    Beam search reorders the rows of the cache after every step. The cache is inside the model,
    so pass `reorder_cache`, a callable `reorder_cache(beam_idx)` that permutes the model's cache
    buffers along their batch axis (gpt-fast: `for b in model.layers: b.attention.kv_cache.k_cache =
    b.attention.kv_cache.k_cache[beam_idx]`, the same for `v_cache`).

    Args:
        model: `model(idx, input_pos, **model_inputs) -> logits` of shape `(batch, seq, vocab)`.
        reorder_cache: `reorder_cache(beam_idx)`, `beam_idx` `(rows,)`: make row `i` of the
            model's cache a copy of row `beam_idx[i]`. Needed only for beam search. Default: None.

    >>> import torch
    >>> from hfbridge import InputPos, generate
    >>> class Counter(torch.nn.Module):           # "predicts" position + 1; no real cache needed
    ...     def forward(self, idx, input_pos):
    ...         return torch.nn.functional.one_hot(input_pos + 1, 16).float().expand(idx.shape[0], -1, -1)
    >>> generate(InputPos(Counter()), torch.tensor([[0, 1, 2]]), max_new_tokens=3).tolist()
    [[0, 1, 2, 3, 4, 5]]
    """

    reserved = ("input_pos",)

    def __init__(self, model: Callable[..., Any], *, reorder_cache: Callable[[torch.Tensor], Any] | None = None):
        super().__init__(model)
        self.reorder_hook = checked_hook(reorder_cache, "reorder_cache", "reorder_cache(beam_idx)")

    def check_reorder(self) -> None:
        if self.reorder_hook is None:
            raise TypeError(
                "beam search reorders the model's cache after every step, and an InputPos model keeps its cache "
                "inside itself; pass InputPos(model, reorder_cache=fn) with fn(beam_idx) permuting the cache "
                "buffers' batch rows (see InputPos's docstring)."
            )

    def reorder_cache(self, state: dict[str, Any], beam_idx: torch.Tensor) -> dict[str, Any]:
        self.check_reorder()
        self.reorder_hook(beam_idx)
        return state

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              model_inputs: dict[str, Any]) -> dict[str, Any]:
        if bool((attention_mask == 0).any()):
            raise ValueError(
                "`attention_mask` has padding (zeros), but an InputPos model (model(idx, input_pos)) takes no "
                "attention mask and would attend to the padding. Generate row by row, or wrap the model in "
                "ReturnsCache/Hooks with an `attention_mask` parameter."
            )
        return super().start(input_ids, attention_mask, model_inputs)

    def forward(self, input_ids: torch.Tensor, state: dict[str, Any]) -> Any:
        fed = state[_FED]
        ids = input_ids[:, fed:]  # [B, S]: the prompt first, then one token
        input_pos = torch.arange(fed, input_ids.shape[1], device=input_ids.device)  # [S]
        return self.model(ids, input_pos, **self.model_inputs(state))

    def crop(self, state: dict[str, Any], length: int) -> dict[str, Any]:
        # The next call feeds from `length` with explicit positions; a gpt-fast cache writes them over
        # the rejected entries, and its causal mask hides anything stored beyond the query positions.
        state[_FED] = min(state[_FED], length)
        return state


def check_padding_taken(adapter: ModelAdapter, attention_mask: torch.Tensor, *, inferred: bool) -> None:
    """Refuse padding for a model that takes no mask (`Recompute`, `ReturnsCache`): it would attend to it.

    A mask the caller passed is refused, not warned about: the padded rows' tokens would change with no
    other sign (a row alone and the same row left-padded in a batch give different tokens), a warning
    is easily lost in a loop or a notebook, and the fix is one parameter. A mask inferred from
    `pad_token_id` in the prompt (HF's rule) gets a warning instead: the pad id may be a real token
    of a model that does not care where it stands. One host read, at the start of the call.
    """
    if getattr(adapter, "takes_mask", True) or getattr(adapter, "mask_unknown", False):
        return  # a catch-all signature cannot tell: ReturnsCache says so itself, naming attention_mask=True/False
    padded = (attention_mask == 0).any(dim=-1)  # [B]
    if not bool(padded.any()):
        return
    rows = padded.nonzero().flatten().tolist()
    fix = ("Give the model's forward an `attention_mask` parameter (a `**kwargs` does not count; it receives the "
           "(batch, seq) mask of the whole sequence, 0 on padding), or generate each prompt on its own, without "
           "padding")
    signature = f"its parameters: {parameter_list(adapter.signature)}"
    if inferred:
        warnings.warn(
            f"`pad_token_id` appears in the prompt of row(s) {rows}, so the attention mask inferred from it (HF's "
            f"rule) has padding, but the model takes no `attention_mask` parameter ({signature}) and attends to "
            f"those tokens. {fix}; if they are real tokens, pass attention_mask= of ones.",
            UserWarning, stacklevel=5)  # the caller of generate
        return
    raise ValueError(
        f"`attention_mask` has padding (zeros) in row(s) {rows}, but the model takes no `attention_mask` parameter "
        f"({signature}), so it would attend to the padding and those rows' tokens would change. {fix}."
    )
