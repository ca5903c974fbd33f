"""HF's private decoding loops, called the way the installed transformers' `generate` calls them.

`run_beam_search` (`GenerationMixin._beam_search`: with a `BeamSearchScorer` in 4.x, vectorized in
5.x) and `run_assisted_decoding` (`GenerationMixin._assisted_decoding`: the candidate generator
built by `generate` in 4.x, by the loop itself in 5.x) take a host (`hfbridge._generate.hf_loops`)
that stands in for the model, and check once that the loop takes the arguments passed
(`contracts.check_parameters`). `candidate_generator` is HF's `_get_candidate_generator`.

>>> from transformers.generation.utils import GenerationMixin
>>> uses_beam_scorer() == ("beam_scorer" in __import__("inspect").signature(GenerationMixin._beam_search).parameters)
True
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation.utils import GenerationMixin

from hfbridge._hf import names
from hfbridge._hf.contracts import TransformersContractError, check_parameters

__all__ = ["candidate_generator", "is_prompt_lookup", "lookup_screens_candidates", "prepare_prompt_lookup",
           "run_assisted_decoding", "run_beam_search", "uses_beam_scorer"]

_LOOP_ARGUMENTS = ("logits_processor", "stopping_criteria", "generation_config", "synced_gpus")


@functools.cache
def uses_beam_scorer() -> bool:
    """Whether the installed `_beam_search` takes a `BeamSearchScorer` (transformers 4.x)."""
    return "beam_scorer" in inspect.signature(GenerationMixin._beam_search).parameters


def run_beam_search(host: Any, input_ids: torch.Tensor, *, processors: Any, criteria: Any,
                    config: GenerationConfig, synced: bool, prompts: int, model_kwargs: dict[str, Any]) -> Any:
    """HF's `_beam_search` on `host`, for `input_ids` `(prompts * num_beams, seq)`; returns what it returns."""
    check_parameters(GenerationMixin._beam_search, _LOOP_ARGUMENTS, what="GenerationMixin._beam_search")
    arguments: dict[str, Any] = {"logits_processor": processors, "stopping_criteria": criteria,
                                 "generation_config": config, "synced_gpus": synced}
    if uses_beam_scorer():
        # transformers 4.x: `generate` builds the scorer; these are its arguments there.
        scorer = importlib.import_module("transformers").BeamSearchScorer(
            batch_size=prompts, num_beams=config.num_beams, device=input_ids.device,
            length_penalty=config.length_penalty, do_early_stopping=config.early_stopping,
            num_beam_hyps_to_keep=config.num_return_sequences, max_length=config.max_length,
        )
        return host._beam_search(input_ids, scorer, **arguments, **model_kwargs)
    return host._beam_search(input_ids, **arguments, **model_kwargs)


def candidate_generator(host: Any, *args: Any, **kwargs: Any) -> Any:
    """HF's `_get_candidate_generator` (prompt lookup or an assistant model, as HF chooses) on `host`."""
    return GenerationMixin._get_candidate_generator(host, *args, **kwargs)


def run_assisted_decoding(host: Any, sequences: torch.Tensor, *, processors: Any, user_processors: Any,
                          criteria: Any, config: GenerationConfig, streamer: Any, assistant: Any,
                          model_kwargs: dict[str, Any]) -> Any:
    """HF's `_assisted_decoding` on `host` (the target), drafting with `assistant` (a draft host) or the prompt."""
    loop = GenerationMixin._assisted_decoding
    check_parameters(loop, (*_LOOP_ARGUMENTS, "streamer"), what="GenerationMixin._assisted_decoding")
    kwargs: dict[str, Any] = {"logits_processor": processors, "stopping_criteria": criteria,
                              "generation_config": config, "synced_gpus": False, "streamer": streamer}
    if "candidate_generator" in inspect.signature(loop).parameters:
        # transformers 4.x: generate() builds the generator, with the user's processors
        kwargs["candidate_generator"] = host._get_candidate_generator(
            generation_config=config, input_ids=sequences, inputs_tensor=sequences, assistant_model=assistant,
            logits_processor=user_processors, target_tokenizer=None, assistant_tokenizer=None,
            model_kwargs=model_kwargs)
    else:
        kwargs.update(inputs_tensor=sequences, assistant_model=assistant, assistant_tokenizer=None, tokenizer=None)
    try:
        return host._assisted_decoding(sequences, **kwargs, **model_kwargs)
    except RuntimeError as error:
        if "requires a cache" not in str(error) or host.step > 0:
            raise
        raise TransformersContractError(  # 4.46 to 5.24 raise this when no cache is under their name
            "assisted-cache", f"its assisted loop raised {str(error)!r} for the cache hfbridge passed as "
                              f"{names.LOOP_CACHE!r}") from error


def is_prompt_lookup(generator: Any) -> bool:
    """Whether HF's candidate generator is its `PromptLookupCandidateGenerator` (or one like it)."""
    return hasattr(generator, "num_output_tokens")


def prepare_prompt_lookup(generator: Any, *, device: torch.device, vocab: int | None) -> None:
    """Set what HF's prompt lookup reads on itself: the logits width (`vocab_size`, 5.x screens candidates
    with it), and an eos tensor that matches nothing where 4.x would fail on `isin(ids, None)`."""
    if getattr(generator, "eos_token_id", 0) is None:
        generator.eos_token_id = torch.empty(0, dtype=torch.long, device=device)
    if vocab is not None:
        generator.vocab_size = vocab


@functools.cache
def lookup_screens_candidates() -> bool:
    """Whether the installed prompt lookup drops candidates its logits processors forbid (transformers 5)."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    return "logits_processor" in inspect.signature(PromptLookupCandidateGenerator.__init__).parameters
