"""Beam search and beam sampling: HF's own `_beam_search` loop, run on an hfbridge model adapter.

The installed transformers' loop runs unchanged on a `LoopHost` (see `_generate/hf_loops/host.py`): the
`BeamSearchScorer` loop of transformers 4.x, the vectorized one of 5.x. `sequences`, and with
`return_dict_in_generate=True` HF's `GenerateBeamDecoderOnlyOutput` (`sequences_scores`, `scores`,
`logits`, `beam_indices`), are therefore HF's for the same options and seed. The model's cache
follows the beams through the adapter's `reorder_cache`.

>>> import torch
>>> from hfbridge import generate
>>> table = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))  # a bigram "model"
>>> generate(lambda ids: table[ids], torch.tensor([[1, 2]]), num_beams=3, max_new_tokens=4)
tensor([[ 1,  2, 13,  9,  3, 11]])
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation.utils import GenerationMixin

from hfbridge._generate.hf_loops.host import LoopHost, StepProcessors
from hfbridge._models.adapters import ModelAdapter
from hfbridge._step.option_checks import check_strategy_options


def check_beam_options(config: GenerationConfig, adapter: ModelAdapter, *, streamer: Any,
                       generator: torch.Generator | None, fast: bool) -> None:
    """Raise, before the first model call, for options beam search cannot honour."""
    check_strategy_options(config)  # length_penalty, early_stopping, ...: also when they came in a config
    if streamer is not None:
        raise ValueError(
            "`streamer` cannot be used with beam search (HF's generate refuses it too: the best beams are only "
            "known at the end); use num_beams=1 to stream."
        )
    if generator is not None:
        raise ValueError(
            "`generator` is not supported with beam search: HF's beam loop draws from the global RNG. "
            "Seed it with torch.manual_seed(...) instead."
        )
    if fast:
        raise ValueError("`fast=True` applies to sampling with num_beams=1; beam search runs HF's own loop.")
    if getattr(config, "low_memory", None):
        raise ValueError(
            "`low_memory=True` (sequential beam search) is not supported: transformers 5 removed it; call "
            "generate() on smaller batches instead."
        )
    adapter.check_reorder()


def beam_search(adapter: ModelAdapter, *, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                state: dict[str, Any], config: GenerationConfig, sampler: Any, criteria: Any, prompts: int,
                on_step: Any = None, synced: bool = False) -> Any:
    """HF's `_beam_search` on `adapter`: `input_ids` and `attention_mask` are `(prompts * num_beams, seq)`.

    With `synced`, HF's loop keeps this rank calling its model until every rank of `torch.distributed`
    is finished (`synced_gpus`); the host feeds the last token again on those calls.

    Returns what HF's loop returns: the sequences `(prompts * num_return_sequences, seq')`, or a
    `GenerateBeamDecoderOnlyOutput` whose `past_key_values` is the adapter's cache.
    """
    # Any: HF types the loop's `self` as a PreTrainedModel, which the host stands in for
    # HF keeps max(2, 1 + eos tokens) candidates per beam; with a smaller vocabulary its topk fails in torch
    eos = config._eos_token_tensor
    candidates = max(2, 1 + (0 if eos is None else int(eos.numel())))
    why = f"beam search keeps {candidates} candidates per beam (2, or 1 + the number of eos tokens)"
    host: Any = LoopHost(adapter, state, sampler, prompts=prompts, rows_per_prompt=config.num_beams,
                         rows_name="num_beams", device=input_ids.device, on_step=on_step,
                         min_vocab=(candidates, why), lockstep=synced)
    model_kwargs = host.model_kwargs(attention_mask)
    processors = StepProcessors(sampler.processors, host)
    if "beam_scorer" in inspect.signature(GenerationMixin._beam_search).parameters:
        # transformers 4.x: `generate` builds the scorer; these are its arguments there.
        scorer = importlib.import_module("transformers").BeamSearchScorer(
            batch_size=prompts, num_beams=config.num_beams, device=input_ids.device,
            length_penalty=config.length_penalty, do_early_stopping=config.early_stopping,
            num_beam_hyps_to_keep=config.num_return_sequences, max_length=config.max_length,
        )
        result = host._beam_search(input_ids, scorer, logits_processor=processors, stopping_criteria=criteria,
                                   generation_config=config, synced_gpus=synced, **model_kwargs)
    else:
        result = host._beam_search(input_ids, logits_processor=processors, stopping_criteria=criteria,
                                   generation_config=config, synced_gpus=synced, **model_kwargs)
    if isinstance(result, torch.Tensor):
        return result
    # HF puts its `past_key_values` (here the host's handle) in the output; users want their cache.
    return dataclasses.replace(result, past_key_values=adapter.cache(host.state))
