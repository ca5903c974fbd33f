"""`Call`: everything one `generate` call works with, prepared before the first model call.

`call.prepare` builds it (the arguments checked, HF's config, criteria and processors, the adapter's
state, the strategy decided once); the strategy's runner and the one-token loop (`loop.py`) work on
it in place. It sits below both, so that neither imports the other to name it.

>>> import dataclasses
>>> [field.name for field in dataclasses.fields(Call)][:4]
['config', 'sampler', 'criteria', 'sequences']
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from hfbridge._generate.banned_loop import BannedLoop
from hfbridge._generate.modes import Strategy
from hfbridge._step.run.sampler import Sampler

__all__ = ["Call"]


@dataclasses.dataclass
class Call:
    """Everything one `generate` call works with, prepared before the first model call."""

    config: GenerationConfig  # prepared as HF prepares it, special-token tensors set
    sampler: Sampler  # this call's processors (fresh) and token choice
    criteria: StoppingCriteriaList  # HF's own, merged with the user's
    sequences: torch.Tensor  # [N, T], N = prompts x rows per prompt; grows by one column a step
    mask: torch.Tensor  # [N, T], grows with `sequences`
    state: dict[str, Any]  # the adapter's state
    prompts: int
    expand: int  # rows per prompt: num_return_sequences (num_beams for beam search)
    scores: tuple | None = None  # per step, when return_dict_in_generate and output_scores
    raw_logits: tuple | None = None  # per step, when return_dict_in_generate and output_logits
    # The user's own processors, prefix_allowed_tokens_fn or stopping criteria run at every step:
    # they may keep state, so the loop stops where HF stops (see `LoopOptions.check_every`).
    user_code: bool = False
    mode: str = "greedy_search"  # HF's generation mode, decided once by `prepare`
    strategy: Strategy | None = None  # its row of the strategy table (None: the draft's own loop)
    user_processors: LogitsProcessorList = dataclasses.field(default_factory=LogitsProcessorList)  # `processors=`
    unconditional: Any = None  # guidance_scale's unconditional branch (`guidance.UnconditionalBranch`), or None
    banned: BannedLoop | None = None  # banned strings and patterns (`banned_loop.py`), or None
    # finished rows get the pad token: a criterion knows eos (HF's `has_eos_stopping_criteria`), decided once
    pads_finished: bool = False
