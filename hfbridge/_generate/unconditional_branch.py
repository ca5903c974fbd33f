"""Classifier-free guidance in `generate`: the unconditional sequence, run through the model's adapter.

HF's `UnbatchedClassifierFreeGuidanceLogitsProcessor` (built where HF builds it, with HF's arithmetic:
`hfbridge._step.plan.guidance_processor`) asks for the unconditional logits once per step. `UnconditionalBranch`
answers the way HF's processor does with an HF model:

- first call: the sequence is `negative_prompt_ids` (mask `negative_prompt_attention_mask`, default
  all ones), or without a negative prompt the last token of each row's prompt;
- each later call: the row's last token is appended (mask: a 1), and the model continues.

Each call goes through the same adapter as the conditional sequence, with a state of its own
(`adapter.start`): `Recompute` feeds the whole unconditional sequence, `ReturnsCache` and `Hooks`
keep their own cache in that state. An `InputPos` model keeps its cache inside itself, which the
unconditional sequence would overwrite: it needs `unconditional_model=`, a second `InputPos` over a
model with caches of its own (sharing the weights).

>>> import torch
>>> from hfbridge import generate
>>> table = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
>>> calls = []
>>> def model(input_ids):                                   # [B, T] -> [B, T, V]
...     calls.append(input_ids.shape[1])
...     return table[input_ids]
>>> out = generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=2, guidance_scale=1.5,
...                negative_prompt_ids=torch.tensor([[4, 5]]))
>>> calls                                     # conditional, unconditional, conditional, unconditional
[3, 2, 4, 3]
"""

from __future__ import annotations

from typing import Any

import torch

from hfbridge._generate.loop import forward_and_update
from hfbridge._models.adapters import InputPos, ModelAdapter
from hfbridge._models.choose import as_adapter

__all__ = ["GUIDANCE_INPUTS", "UnconditionalBranch", "check_guidance_loop", "split_guidance", "unconditional_branch"]

# generate's keywords for guidance that are neither generation options nor model inputs (HF's names).
GUIDANCE_INPUTS = ("negative_prompt_ids", "negative_prompt_attention_mask", "unconditional_model")


def split_guidance(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`generate`'s `**kwargs` without the guidance inputs, and the guidance inputs."""
    guidance = {name: kwargs[name] for name in GUIDANCE_INPUTS if name in kwargs}
    if not guidance:
        return kwargs, {}
    return {name: value for name, value in kwargs.items() if name not in guidance}, guidance


def _check_negative_prompt(ids: Any, mask: Any, input_ids: torch.Tensor) -> tuple[Any, Any]:
    """The negative prompt and its mask, checked against the prompts `input_ids` `(batch, seq)`."""
    if ids is None:
        if mask is not None:
            raise ValueError("`negative_prompt_attention_mask` was given without `negative_prompt_ids`; pass the "
                             "negative prompt's ids too (or neither: the unconditional sequence then starts from "
                             "each prompt's last token, as HF).")
        return None, None
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"`negative_prompt_ids` must be a (batch, seq) tensor of token ids, got {type(ids).__name__}.")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"`negative_prompt_ids` must hold integer token ids, got dtype {ids.dtype}.")
    batch = input_ids.shape[0]
    if ids.ndim != 2 or ids.shape[0] != batch or ids.shape[1] == 0:
        raise ValueError(
            f"`negative_prompt_ids` must be (batch, seq) with one row per prompt ({batch}) and at least one token, "
            f"got shape {tuple(ids.shape)}."
        )
    if ids.device != input_ids.device:
        raise ValueError(f"`negative_prompt_ids` are on {ids.device} but `input_ids` are on {input_ids.device}; "
                         "move one of them.")
    if bool((ids < 0).any()):
        raise ValueError(f"`negative_prompt_ids` hold a negative token id ({int(ids.min())}); token ids are >= 0.")
    if mask is None:
        return ids.long(), None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"`negative_prompt_attention_mask` must be a tensor of 0/1, got {type(mask).__name__}.")
    if mask.is_floating_point() or mask.is_complex():
        raise TypeError(f"`negative_prompt_attention_mask` must hold integers 0/1 (or bools), got dtype {mask.dtype}.")
    if mask.shape != ids.shape:
        raise ValueError(f"`negative_prompt_attention_mask` must have the shape of `negative_prompt_ids` "
                         f"{tuple(ids.shape)}, got {tuple(mask.shape)}.")
    if mask.device != ids.device:
        raise ValueError(f"`negative_prompt_attention_mask` is on {mask.device} but `negative_prompt_ids` are on "
                         f"{ids.device}; move one of them.")
    mask = mask.long()
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("`negative_prompt_attention_mask` must hold only 0 (padding) and 1 (token).")
    if bool((mask == 0).all(dim=-1).any()):
        raise ValueError("`negative_prompt_attention_mask` has a row of zeros: every negative prompt needs a token.")
    return ids.long(), mask


class UnconditionalBranch:
    """`branch(input_ids) -> the model's output` for the unconditional sequence (one model call per call).

    Args:
        adapter: The model's adapter (the conditional one, or `unconditional_model`'s).
        negative_ids: `(rows, seq)` negative prompt, or None (start from each row's last token).
        negative_mask: `(rows, seq)` its mask, or None (all ones).
        model_inputs: The extra model inputs of the conditional sequence, given to this one too.

    Attributes:
        calls: How many model calls it made.
    """

    def __init__(self, adapter: ModelAdapter, negative_ids: torch.Tensor | None, negative_mask: torch.Tensor | None,
                 model_inputs: dict[str, Any]):
        self.adapter = adapter
        self.negative_ids, self.negative_mask = negative_ids, negative_mask
        self.model_inputs = model_inputs
        self.sequence: torch.Tensor | None = None  # [N, S]: the unconditional sequence so far
        self.mask: torch.Tensor | None = None  # [N, S]
        self.state: dict[str, Any] = {}
        self.calls = 0

    def __repr__(self) -> str:
        start = "negative_prompt_ids" if self.negative_ids is not None else "each prompt's last token"
        return f"UnconditionalBranch({self.adapter!r} from {start})"

    def check_vocab(self, vocab: int, vocab_size: int | None = None) -> None:
        """`ValueError` for a negative prompt id outside the vocabulary of `vocab` tokens, as for `input_ids`.

        Called where `input_ids` are checked (step 0, once the logits' width is known), before the
        first unconditional call feeds the negative prompt to the model.
        """
        ids = self.negative_ids
        if ids is None or not ids.numel():
            return
        if bool((ids >= vocab).any()):  # ids >= 0 were checked up front
            bad = int(ids[ids >= vocab][0])
            raise ValueError(
                f"`negative_prompt_ids` hold token id {bad}, outside the vocabulary of {vocab} tokens "
                f"(ids must be in [0, {vocab}); vocab_size={vocab_size})."
            )

    def __call__(self, input_ids: torch.Tensor) -> Any:
        new = input_ids[:, -1:]  # [N, 1]: HF's `input_ids[:, -1:]`
        if self.sequence is None or self.mask is None:  # HF's first pass
            sequence = self.negative_ids if self.negative_ids is not None else new
            mask = self.negative_mask if self.negative_mask is not None else torch.ones_like(sequence)
            self.state = self.adapter.start(sequence, mask, dict(self.model_inputs))
        else:
            sequence = torch.cat([self.sequence, new], dim=1)
            mask = torch.cat([self.mask, torch.ones_like(new)], dim=1)
        self.sequence, self.mask = sequence, mask
        self.state["attention_mask"] = mask
        context = f"the unconditional sequence of guidance_scale, {sequence.shape[1]} tokens"
        outputs, self.state = forward_and_update(self.adapter, sequence, self.state, self.calls, context)
        self.calls += 1
        return self.adapter.logits(outputs)


def unconditional_branch(adapter: ModelAdapter, config: Any, guidance: dict[str, Any], *, input_ids: torch.Tensor,
                         expand: int, model_inputs: dict[str, Any], assisted: bool = False
                         ) -> UnconditionalBranch | None:
    """The branch for `generate`'s `guidance_scale` (None when guidance is off), every input checked first.

    `input_ids` are the prompts `(batch, seq)`; `expand` repeats each negative prompt for
    `num_return_sequences` (HF's `generate` does not, and fails there); `model_inputs` are the
    conditional sequence's (already repeated); `assisted`: the call drafts tokens (refused with guidance).
    """
    negative_ids, negative_mask = _check_negative_prompt(guidance.get("negative_prompt_ids"),
                                                         guidance.get("negative_prompt_attention_mask"), input_ids)
    scale = getattr(config, "guidance_scale", None)
    if scale is None or scale == 1:
        return None  # HF builds no guidance processor: plain generation
    if assisted:
        raise ValueError(
            f"`guidance_scale`={scale!r} with assisted / prompt-lookup decoding is not supported: HF's guidance "
            "processor would be called once per draft token and take each as a new step of the unconditional "
            "sequence. Use greedy search, sampling or beam search with guidance."
        )
    branch_adapter = adapter
    if guidance.get("unconditional_model") is not None:
        try:
            branch_adapter = as_adapter(guidance["unconditional_model"])
        except TypeError as error:
            raise TypeError(f"`unconditional_model`: {error}") from None
        if branch_adapter is adapter or (branch_adapter.model is adapter.model and isinstance(adapter, InputPos)):
            raise ValueError("`unconditional_model` must have its own cache: pass a second model instance.")
    elif isinstance(adapter, InputPos):
        raise ValueError(
            f"`guidance_scale`={scale!r} runs an unconditional sequence beside the prompt's, and an InputPos model "
            "keeps its one cache inside itself, which that sequence would overwrite. Pass unconditional_model="
            "InputPos(second_model): a second instance sharing the weights, with caches of its own (gpt-fast: "
            "copy.copy(model) and setup_caches on it); or wrap the model in ReturnsCache / Hooks / Recompute, "
            "whose state lives outside the model."
        )
    if expand > 1 and negative_ids is not None:
        negative_ids = negative_ids.repeat_interleave(expand, dim=0)  # [B * n, S]
        negative_mask = None if negative_mask is None else negative_mask.repeat_interleave(expand, dim=0)
    return UnconditionalBranch(branch_adapter, negative_ids, negative_mask, model_inputs)


def check_guidance_loop(config: Any, synced: bool) -> None:
    """`synced_gpus` with guidance: a finished rank calls only the conditional model, so its collectives
    would not pair with a rank still making unconditional calls."""
    scale = getattr(config, "guidance_scale", None)
    if synced and scale is not None and scale != 1:
        raise ValueError(
            f"`guidance_scale`={scale!r} with `synced_gpus` is not supported: a rank whose rows are finished calls "
            "only the conditional model while the others also make the unconditional calls, so the ranks' "
            "collectives would not pair. Use synced_gpus=False (each rank generating on its own)."
        )
