"""Why a generation's setting did what it did at one step, from its tokens alone: DRY's repeats, a thinking budget.

`compare_generation` asks this at the step where the settings part. The samplers whose reasons follow from
the tokens so far (a class trait, ``replays_from_ids``: DRY keeps no state, the thinking budget replays the
generated tokens from ``prompt_length``) are built afresh from the setting's options and run once on the
setting's own sequences up to that step, then asked (`describe_last`). XTC's coin is not among them: it came
from the generator during the generation, and drawing it again would move the caller's generator.

>>> import torch
>>> reasons = parting_reasons(dict(dry_multiplier=1.0, dry_base=2.0, dry_sequence_breakers=[]),
...                           torch.tensor([[4, 1, 2, 3, 9, 4, 1, 2, 3, 9]]), 3, 6, 0, 10, None)
>>> [reason.text() for reason in reasons]
['#9 would extend the repeat #4 #1 #2 #3 (4 tokens, also at 0-3): -1*2^(4-2) = -4']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hfbridge._step.plan.option_table import ROWS
from hfbridge._step.run.sampler import Sampler

__all__ = ["parting_reasons"]


def parting_reasons(setting: Mapping[str, Any], sequences: torch.Tensor, prompt_length: int, step: int, row: int,
                    vocab: int, tokenizer: Any) -> list[Any]:
    """The reasons (`DRYMatch`, `BudgetState`, ...) of ``row`` at generated ``step``: what those samplers did to
    the step that chose token ``prompt_length + step`` of ``sequences`` `(rows, seq)` (the setting's own)."""
    options = {name: value for name, value in setting.items()
               if name in ROWS and getattr(ROWS[name].processor, "replays_from_ids", False)}
    if not options:
        return []
    sampler = Sampler(tokenizer=tokenizer, prompt_length=prompt_length, **options)
    ids = sequences[:, : prompt_length + step]  # [B, T]: what the step saw
    scores = torch.zeros(ids.shape[0], vocab, device=ids.device)  # [B, V]: the reasons do not read the scores
    found: list[Any] = []
    for processor in sampler.processors:
        if getattr(processor, "replays_from_ids", False):
            processor(ids, scores.clone())
            reasons = processor.describe_last(ids)[row]
            found += [] if reasons is None else reasons if isinstance(reasons, list) else [reasons]
    return found
