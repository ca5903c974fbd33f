"""`guidance_scale=`: HF's classifier-free guidance, with the unconditional logits from hfbridge's caller.

HF's `UnbatchedClassifierFreeGuidanceLogitsProcessor` calls an HF model a second time itself (on a
negative prompt, or on the prompt's last token) and mixes the two log-softmaxes,
`scale * (cond - uncond) + uncond`. hfbridge keeps HF's class, and with it the arithmetic of the
installed transformers (its `__call__`), and replaces only where the unconditional logits come
from (`get_unconditional_logits`): `unconditional(input_ids)`, a callable the caller supplies.
`generate` supplies one that runs the unconditional sequence through the model's adapter
(`hfbridge._generate.unconditional_branch`); `sample_step` one that returns the `unconditional_logits=` it was given.

HF's `_get_logits_processor` builds the processor at HF's place (first in the chain) with a
stand-in host as its model; `with_unconditional` swaps it for a `ClassifierFreeGuidance`.

>>> import torch
>>> scores = torch.tensor([[0.0, 1.0, 2.0]])
>>> guidance = ClassifierFreeGuidance(3.0, lambda ids: torch.tensor([[[2.0, 1.0, 0.0]]]), rows=lambda x: x[:, -1])
>>> guidance(torch.tensor([[0]]), scores).argmax(-1).tolist()
[2]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.generation.logits_process import UnbatchedClassifierFreeGuidanceLogitsProcessor

from hfbridge._step.checks.caller_inputs import extract_logits
from hfbridge._step.plan.watermark import is_synthid

__all__ = ["ClassifierFreeGuidance", "checked_unconditional", "last_position", "refuse_synthid_step",
           "refuse_without_unconditional", "step_guidance", "with_unconditional"]

Unconditional = Callable[[torch.Tensor], Any]


class ClassifierFreeGuidance(UnbatchedClassifierFreeGuidanceLogitsProcessor):
    """HF's classifier-free guidance processor, with the unconditional logits from `unconditional`.

    Args:
        guidance_scale: The guidance scale (HF's `guidance_scale`; 1 leaves the distribution as it is).
        unconditional: `unconditional(input_ids) -> logits`, called once per step with the tokens so
            far `(rows, seq)`; returns the unconditional model's output (a tensor, tuple, mapping or
            `ModelOutput` in the sampler's layout), whose last position is used.
        rows: Turns that output into `(rows, vocab)` logits (the sampler's layout and `vocab_size`).
    """

    def __init__(self, guidance_scale: float, unconditional: Unconditional,
                 rows: Callable[[Any], torch.Tensor]):
        super().__init__(guidance_scale, model=None)
        self.unconditional = unconditional
        self._rows = rows
        self._expected: tuple[int, ...] | None = None  # the scores' shape, set at each call
        self._device = torch.device("cpu")

    display_name = "UnbatchedClassifierFreeGuidanceLogitsProcessor"  # HF's class, for views and errors

    @property
    def display_params(self) -> dict[str, Any]:
        return {"guidance_scale": self.guidance_scale}

    def __repr__(self) -> str:
        return f"{self.display_name}(guidance_scale={self.guidance_scale!r}; unconditional={self.unconditional!r})"

    def get_unconditional_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`(rows, 1, vocab)`: HF's `__call__` takes the last position and its log-softmax."""
        rows = self._rows(self.unconditional(input_ids))  # [N, V]
        expected = self._expected
        if expected is not None and tuple(rows.shape) != expected:
            raise ValueError(
                f"`guidance_scale`: the unconditional logits give {tuple(rows.shape)} (rows, vocab), but the "
                f"conditional scores are {expected}; the unconditional model must give one row per sequence over "
                "the same vocabulary."
            )
        if expected is not None and rows.device != self._device:
            rows = rows.to(self._device)
        return rows[:, None, :]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._expected, self._device = tuple(scores.shape), scores.device
        return super().__call__(input_ids, scores)  # HF's arithmetic for the installed version


def checked_unconditional(unconditional: Any) -> Unconditional | None:
    """`unconditional` if None or callable, else a `TypeError` saying what it must be."""
    if unconditional is not None and not callable(unconditional):
        raise TypeError(
            "`unconditional` must be callable as unconditional(input_ids) -> the model's logits on the "
            f"unconditional (or negative) sequence, got {type(unconditional).__name__}."
        )
    return unconditional


def refuse_synthid_step(options: dict[str, Any], generation_config: Any = None) -> None:
    """`sample_step` refuses a SynthID Text watermark, whose processor carries the last tokens from one
    step to the next: a one-call `sample_step` would start it afresh at every step."""
    watermark = options.get("watermarking_config", getattr(generation_config, "watermarking_config", None))
    if is_synthid(watermark):
        raise ValueError(
            "sample_step() cannot apply a SynthIDTextWatermarkingConfig: HF's SynthID processor keeps state from "
            "step to step (the last ngram_len - 1 tokens it saw and a history of contexts), which a new step would "
            "start afresh. Build a Sampler(watermarking_config=...) once and call it at every step, or use generate()."
        )


def step_guidance(unconditional_logits: Any) -> dict[str, Any]:
    """`sample_step`'s extra Sampler options: `unconditional` returning this step's `unconditional_logits`."""
    if unconditional_logits is None:
        return {}
    try:
        logits = extract_logits(unconditional_logits)
    except TypeError as error:
        raise TypeError(str(error).replace("`logits`", "`unconditional_logits`")) from None

    def unconditional(input_ids: torch.Tensor) -> torch.Tensor:
        return logits

    return {"unconditional": unconditional}


def last_position(output: Any) -> torch.Tensor:
    """`(rows, vocab)` logits from a model output: the last position of `(batch, seq, vocab)`, or `(batch, vocab)`."""
    logits = extract_logits(output)
    if logits.ndim == 3:
        return logits[:, -1]
    if logits.ndim == 2:
        return logits
    raise ValueError(f"`guidance_scale`: the unconditional logits must be (batch, seq, vocab) or (batch, vocab), "
                     f"got shape {tuple(logits.shape)}.")


def with_unconditional(processors: Any, unconditional: Unconditional,
                       rows: Callable[[Any], torch.Tensor], *, built_by: Any) -> Any:
    """`processors` (HF's list, in place) with HF's guidance processor replaced by a `ClassifierFreeGuidance`.

    Only the one HF built with `built_by` (the stand-in host) as its model: a guidance processor of
    the user's own, which HF 5 puts in its place, stays.
    """
    for index, processor in enumerate(processors):
        if type(processor) is UnbatchedClassifierFreeGuidanceLogitsProcessor and processor.model is built_by:
            processors[index] = ClassifierFreeGuidance(processor.guidance_scale, unconditional, rows)
    return processors


def refuse_without_unconditional(guidance_scale: Any) -> None:
    """The error for `guidance_scale` where nobody supplies unconditional logits."""
    raise ValueError(
        f"`guidance_scale`={guidance_scale!r} needs the unconditional logits: classifier-free guidance mixes "
        "these logits with the model's logits on an unconditional (or negative) prompt, and there is no model "
        "to call here. Pass them for this step: sample_step(logits, input_ids, guidance_scale=..., "
        "unconditional_logits=model(negative_ids)); with a Sampler, Sampler(..., guidance_scale=..., "
        "unconditional=fn) where fn(input_ids) returns them; or let generate(model, ..., guidance_scale=...) "
        "make the unconditional calls."
    )
