"""Beam search and beam sampling: HF's own `_beam_search` loop, run on an hfbridge model adapter.

The installed transformers' loop runs unchanged on a `LoopHost` (see `_generate/hf_loops/loop_stand_in.py`): the
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

from typing import Any

import torch
from transformers import GenerationConfig

from hfbridge._generate.hf_loops.loop_stand_in import LoopHost, StepProcessors
from hfbridge._hf.loops import run_beam_search
from hfbridge._hf.outputs import with_cache
from hfbridge._hf.stand_in import special_token
from hfbridge._models.adapters import ModelAdapter
from hfbridge._step.checks.option_checks import check_strategy_options


def check_beam(adapter: ModelAdapter, config: GenerationConfig, options: Any, **ignored: Any) -> None:
    """The strategy row's check (`strategies.STRATEGIES`): `check_beam_options` with `generate`'s options."""
    check_beam_options(config, adapter, streamer=options.streamer, generator=options.generator, fast=options.fast)


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
                on_step: Any = None, synced: bool = False, unconditional: Any = None) -> Any:
    """HF's `_beam_search` on `adapter`: `input_ids` and `attention_mask` are `(prompts * num_beams, seq)`.

    With `synced`, HF's loop keeps this rank calling its model until every rank of `torch.distributed`
    is finished (`synced_gpus`); the host feeds the last token again on those calls. `unconditional`:
    guidance's branch, whose negative prompt is checked against the vocabulary with the prompts.
    Stateful processors follow the beams (`reorder(beam_idx)` where HF reorders the cache).

    Returns what HF's loop returns: the sequences `(prompts * num_return_sequences, seq')`, or a
    `GenerateBeamDecoderOnlyOutput` whose cache (`past_key_values`, `cache` since 5.24) is the adapter's.
    """
    # Any: HF types the loop's `self` as a PreTrainedModel, which the host stands in for
    # HF keeps max(2, 1 + eos tokens) candidates per beam; with a smaller vocabulary its topk fails in torch
    eos = special_token(config, "eos")
    candidates = max(2, 1 + (0 if eos is None else int(eos.numel())))
    why = f"beam search keeps {candidates} candidates per beam (2, or 1 + the number of eos tokens)"
    host: Any = LoopHost(adapter, state, sampler, prompts=prompts, rows_per_prompt=config.num_beams,
                         rows_name="num_beams", device=input_ids.device, on_step=on_step,
                         min_vocab=(candidates, why), lockstep=synced, unconditional=unconditional)
    host.prefill_early(input_ids, attention_mask)  # HF's loop reads config.vocab_size before its first call
    result = run_beam_search(host, input_ids, processors=StepProcessors(sampler.processors, host), criteria=criteria,
                             config=config, synced=synced, prompts=prompts,
                             model_kwargs=host.model_kwargs(attention_mask))
    if isinstance(result, torch.Tensor):
        return result
    # HF puts its cache (here the host's handle) in the output; users want their model's cache.
    return with_cache(result, adapter.cache(host.state))
