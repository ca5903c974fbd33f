"""A `Sampler`'s options resolved from every source (`resolve_options`), and its chain built from what it is
given (`build_chain`): HF's list for the config (`processors_for_config`), merged per group of rows for per-row
values (`RowPlan.build`), with a copy per row of each stateful processor when the fast path draws each row with
its own generator; and the checks of the `Sampler`'s own arguments.

>>> from transformers import GenerationConfig
>>> from hfbridge._step.run.per_row_draw import RowState
>>> chain = build_chain(GenerationConfig(do_sample=True, top_k=2), ChainInputs(), device=torch.device("cpu"),
...                     generator=None, row_state=RowState(None, None), fast=False)
>>> [type(p).__name__ for p in chain]
['TopKLogitsWarper']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from transformers import GenerationConfig

from hfbridge._step.checks.option_checks import check_flag, per_row_from_config
from hfbridge._step.plan.build_processors import make_generation_config, processors_for_config
from hfbridge._step.plan.option_table import sampling_processors
from hfbridge._step.plan.per_row import PerRowValues, split_per_row
from hfbridge._step.plan.phase_options import check_thinking_options
from hfbridge._step.run.per_row_draw import Generators, RowState
from hfbridge._step.run.processor_list import CheckedProcessorList

__all__ = ["ChainInputs", "build_chain", "check_arguments", "first_warper", "resolve_options"]


@dataclasses.dataclass(frozen=True)
class ChainInputs:
    """What the chain is built from besides the config: the `Sampler`'s arguments of the same names."""

    processors: Iterable[Callable] | None = None
    prompt_length: int | None = None
    attention_mask: torch.Tensor | None = None
    prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None
    unconditional: Callable[[torch.Tensor], Any] | None = None
    tokenizer: Any = None


def build_chain(config: GenerationConfig, inputs: ChainInputs, *, device: torch.device, generator: Generators,
                row_state: RowState, fast: bool, rows: Callable[[Any], torch.Tensor] | None = None
                ) -> CheckedProcessorList:
    """The `CheckedProcessorList` each step of a `Sampler` runs, on `device` (see the module); `rows(output)`
    turns guidance's unconditional output into `(rows, vocab)` logits."""
    mask = inputs.attention_mask.to(device) if inputs.attention_mask is not None else None

    def build(one: GenerationConfig) -> CheckedProcessorList:
        return processors_for_config(one, processors=inputs.processors, prompt_length=inputs.prompt_length,
                                     attention_mask=mask, device=device,
                                     prefix_allowed_tokens_fn=inputs.prefix_allowed_tokens_fn,
                                     unconditional=inputs.unconditional, rows=rows,
                                     tokenizer=inputs.tokenizer, generator=generator)  # type: ignore[return-value]

    processors = build(config)
    if row_state.plan is not None:  # HF's list per group of rows, merged (`RowPlan.build`)
        processors = CheckedProcessorList(row_state.plan.build(processors, build, device))
    if fast and isinstance(generator, (list, tuple)):  # each row drawn alone: its own state too
        processors = CheckedProcessorList(row_state.per_row_copies(list(processors), len(generator)))
    return processors


def check_arguments(vocab_size: Any, fast: Any, attention_mask: Any) -> None:
    """The `Sampler`'s own arguments: a clear error naming the one that does not fit."""
    if vocab_size is not None and (not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1):
        raise ValueError(f"`vocab_size` must be a positive int, got {vocab_size!r}.")
    check_flag("fast", fast, optional=False)
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or attention_mask.ndim != 2):
        is_tensor = isinstance(attention_mask, torch.Tensor)
        got = tuple(attention_mask.shape) if is_tensor else type(attention_mask).__name__
        raise ValueError(f"`attention_mask` must be a (batch, seq) tensor, got {got}.")


def resolve_options(generation_config: GenerationConfig | None, do_sample: bool | None, prompt_length: int | None,
                    thinking_options: Mapping[str, Any] | None, options: dict[str, Any]
                    ) -> tuple[GenerationConfig, PerRowValues | None, dict[str, Any] | None,
                               Callable[[dict[str, Any]], GenerationConfig]]:
    """A `Sampler`'s options from every source, checked once: `(the prepared config, the values per row, the
    thinking options, how a phase's options are prepared)`."""
    thinking = check_thinking_options(thinking_options)  # by name, before any work
    # one value per row in a passed config rides the same per-row groups as the keyword
    options, per_row = split_per_row(per_row_from_config(generation_config, options))
    config = make_generation_config(generation_config, do_sample=do_sample, prompt_length=prompt_length,
                                    phased=thinking is not None, **options)

    def prepare_phase(phase: dict[str, Any]) -> GenerationConfig:
        return make_generation_config(generation_config, do_sample=phase.pop("do_sample", do_sample),
                                      prompt_length=prompt_length, phased=True, **{**options, **phase})

    return config, per_row, thinking, prepare_phase


def first_warper(processors: Sequence[Any]) -> int:
    """The place of the chain's first warper (HF's or ours, or a per-row one); the length when there is none."""
    warpers = sampling_processors() | {"PerRowTemperature"}
    for place, processor in enumerate(processors):
        if type(processor).__name__ in warpers or getattr(processor, "name", None) in warpers:
            return place
    return len(processors)
