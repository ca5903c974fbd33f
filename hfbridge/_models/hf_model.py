"""The `HFModel` adapter: a transformers `PreTrainedModel` called exactly as its own `generate` calls it.

`generate(model, ...)` with a decoder-only `PreTrainedModel` picks this adapter by itself (an
adapter you pass explicitly still wins). It does what `model.generate` does around each call:

- the model's `generation_config` supplies the defaults (eos, pad, lengths, sampling options),
  merged by HF's own `_prepare_generation_config`, so `generation_config=` and keyword options
  override it as in HF (see `hfbridge._generate.call`);
- the first cache is the one HF's `generate` creates (`_prepare_cache_for_generation`); the prompt
  is fed once, then one new token per call with the cache the model returned;
- each call's inputs come from the model's own `prepare_inputs_for_generation`, given what the
  installed `generate` passes it whatever the override names (`next_sequence_length` and
  `is_first_iteration` in 5.x, `cache_position` in 4.x; position ids from the mask with left
  padding, the cache under the installed version's name, `logits_to_keep=1`); a model that would be
  fed its whole sequence again on top of its cache is a `TransformersContractError`; see
  `hfbridge._hf.model_inputs` for what differs between transformers versions;
- the cache carried is the one HF's loop carries: the one returned, else the one passed in (a model
  that fills its cache in place); stateful models are refused for assisted decoding, and a class
  with a `generate` of its own is refused, before any model call.

Beam search reorders and assisted decoding crops the HF cache (`hfbridge._models.cache`).

>>> import torch
>>> from transformers import GPT2Config, GPT2LMHeadModel
>>> from hfbridge import generate
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> config = GPT2Config(vocab_size=16, n_positions=16, n_embd=8, n_layer=1, n_head=1, bos_token_id=0, eos_token_id=15)
>>> model = GPT2LMHeadModel(config).eval()
>>> prompt = torch.tensor([[1, 2, 3]])
>>> torch.equal(generate(model, prompt, max_new_tokens=4), model.generate(prompt, max_new_tokens=4))
True
"""

from __future__ import annotations

from typing import Any

import torch

from hfbridge._hf.model_inputs import (
    carried_cache,
    drops_full_mask,
    first_cache,
    is_stateful,
    keep_for_rollback,
    own_generate,
    reorder_model_cache,
    step_inputs,
)
from hfbridge._hf.stand_in import ProcessorHost
from hfbridge._models.adapters import ModelAdapter
from hfbridge._models.cache import check_croppable, crop_cache, reorder_cache

__all__ = ["HFModel", "is_hf_model"]

# The adapter's own state entries (see `ModelAdapter`).
_FED = "_fed"  # positions the cache holds
_CACHE = "_cache"  # the model's cache entries by input name ({"past_key_values": DynamicCache})
_KEEP = "_keep"  # logits_to_keep: 1, or "fed" (every fed position: assisted decoding)
_MASK = "_mask"  # pass the attention mask (False where HF drops an all-ones one)
_USE_CACHE = "_use_cache"
_CALLS = "_calls"  # model calls made in this generate call (the first is HF's prefill)


def is_hf_model(model: Any) -> bool:
    """Whether `model` is a transformers `PreTrainedModel` that generates (has `prepare_inputs_for_generation`)."""
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    return isinstance(model, PreTrainedModel) and callable(getattr(model, "prepare_inputs_for_generation", None))


class HFModel(ModelAdapter):
    """A decoder-only transformers `PreTrainedModel`, fed as its own `model.generate` feeds it.

    Args:
        model: The model (`LlamaForCausalLM`, `GPT2LMHeadModel`, any `...ForCausalLM`).

    Raises:
        TypeError: for a model that is not a `PreTrainedModel` with `prepare_inputs_for_generation`,
            or an encoder-decoder model.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from hfbridge import generate
    >>> config = GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=1, bos_token_id=0, eos_token_id=9)
    >>> generate(HFModel(GPT2LMHeadModel(config).eval()), torch.tensor([[1, 2]]), max_new_tokens=3).shape
    torch.Size([1, 5])
    """

    # Inputs HF's `generate` makes and advances itself at every step (position ids from the mask).
    reserved = ("past_key_values", "cache", "cache_position", "logits_to_keep", "num_logits_to_keep", "position_ids")

    def __init__(self, model: Any):
        if not is_hf_model(model):
            raise TypeError(
                f"HFModel takes a transformers PreTrainedModel with prepare_inputs_for_generation, got "
                f"{type(model).__name__}; wrap other models in Recompute, ReturnsCache, InputPos or Hooks."
            )
        if getattr(model.config, "is_encoder_decoder", False):
            raise TypeError(
                f"HFModel takes decoder-only models, but {type(model).__name__} is an encoder-decoder model; "
                "pass its decoder step as a callable (ReturnsCache; docs/hf_models.md has the recipe) or use the "
                "model's own generate."
            )
        overridden = own_generate(model)
        if overridden is not None:
            raise TypeError(
                f"{type(model).__name__} has a generate of its own ({overridden}), which decodes differently from "
                "transformers' GenerationMixin.generate that hfbridge mirrors; hfbridge would not give its tokens. "
                "Use the model's own generate, or pass a callable (hfbridge.Recompute / ReturnsCache) to decode it "
                "as a plain language model."
            )
        super().__init__(model)
        self.hf: Any = model  # typed as the PreTrainedModel it is

    def host(self, device: torch.device) -> ProcessorHost:
        """A host for HF's helpers whose `config` and `generation_config` are the model's, as in `model.generate`."""
        host = ProcessorHost(device=device)
        host.config = self.hf.config
        host.generation_config = self.hf.generation_config
        return host

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              model_inputs: dict[str, Any]) -> dict[str, Any]:
        state = super().start(input_ids, attention_mask, model_inputs)
        state.update({_CACHE: {}, _KEEP: "fed", _MASK: True, _USE_CACHE: True, _CALLS: 0})
        return state

    def begin(self, state: dict[str, Any], config: Any, *, prompts: int, assisted: bool,
              rollback: bool = False) -> dict[str, Any]:
        """The state for one call with the prepared `config`: HF's first cache, `logits_to_keep`, the mask rule.

        Args:
            state: The state `start` returned.
            config: The call's prepared `GenerationConfig`.
            prompts: Prompts in the call, before expansion for beams / returned sequences.
            assisted: The call runs assisted or prompt-lookup decoding, which checks every fed position.
            rollback: The call may crop the cache without assisted decoding (banned strings).
        """
        if assisted and is_stateful(self.hf):
            # HF's `generate` refuses it before any model call: a recurrent state cannot go back to a prefix
            raise ValueError(
                f"assisted generation is not supported with stateful models, such as {type(self.hf).__name__} "
                "(as transformers' own generate says): its recurrent state cannot be rolled back to the accepted "
                "draft tokens. Use greedy or sampling without assistant_model= / prompt_lookup_num_tokens=."
            )
        mask = state["attention_mask"]  # [N, T]
        state[_USE_CACHE] = config.use_cache is not False
        state[_CACHE] = first_cache(self.hf, config, batch=prompts, max_length=config.max_length,
                                    device=mask.device)
        state[_KEEP] = "fed" if assisted else 1
        if assisted or rollback:
            keep_for_rollback(state[_CACHE])
        state[_MASK] = not drops_full_mask() or bool((mask == 0).any())
        return state

    def forward(self, input_ids: torch.Tensor, state: dict[str, Any]) -> Any:
        fed = state[_FED]
        keep = input_ids.shape[1] - fed if state[_KEEP] == "fed" else state[_KEEP]
        inputs = step_inputs(self.hf, input_ids, cache=state[_CACHE], fed=fed,
                             attention_mask=state["attention_mask"] if state[_MASK] else None, keep=keep,
                             model_inputs=self.model_inputs(state), use_cache=state[_USE_CACHE],
                             first=state[_CALLS] == 0, assisted=state[_KEEP] == "fed")
        state[_CALLS] += 1
        return self.model(**inputs, return_dict=True)

    def update(self, outputs: Any, input_ids: torch.Tensor, state: dict[str, Any]) -> dict[str, Any]:
        if state[_USE_CACHE]:
            # as HF's loop: the cache the output returned, else the one passed in (a model that fills its
            # cache in place and does not return it, e.g. RoBERTa's family)
            state[_CACHE] = carried_cache(self.hf, outputs, state[_CACHE])
            # a model without a cache HF knows of is fed the whole sequence again, as by HF
            state[_FED] = input_ids.shape[1] if state[_CACHE] else 0
        return state

    def logits(self, outputs: Any) -> Any:
        return outputs.logits

    def cache(self, state: dict[str, Any]) -> Any:
        return next(iter(state.get(_CACHE, {}).values()), None)

    def reorder_cache(self, state: dict[str, Any], beam_idx: torch.Tensor) -> dict[str, Any]:
        state[_CACHE] = {name: _reordered(self.hf, value, beam_idx) for name, value in state[_CACHE].items()}
        return state

    def check_crop(self, state: dict[str, Any]) -> None:
        """After the first call, before any rollback: each cache entry must be one `crop` can cut (a recurrent
        state, Mamba's, cannot go back)."""
        for name, value in state.get(_CACHE, {}).items():
            check_croppable(value, state.get(_FED, 0), where=f"the model's `{name}`")

    def crop(self, state: dict[str, Any], length: int) -> dict[str, Any]:
        if length < state.get(_FED, 0):
            state[_CACHE] = {name: crop_cache(value, length, cached=state[_FED])
                             for name, value in state[_CACHE].items()}
            state[_FED] = length
        return state


def _reordered(model: Any, cache: Any, beam_idx: torch.Tensor) -> Any:
    """As HF's beam search (`reorder_model_cache`); a nest neither the model nor the cache reorders is rebuilt
    by `reorder_cache` (tuples of batch-first tensors)."""
    reordered = reorder_model_cache(model, cache, beam_idx)
    return reordered if reordered is not None else reorder_cache(cache, beam_idx)
