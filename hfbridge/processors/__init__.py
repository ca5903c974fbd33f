"""Samplers that transformers lacks, as `transformers.LogitsProcessor`s.

Each class here works in hfbridge's `sample_step`, `Sampler` and `generate` (as keyword options or
in `processors=`), and in transformers' own `model.generate(logits_processor=[...])`. Every one is
batched (no Python loop over rows or tokens), makes no host read of a device value, and takes one
value or one value per row for each numeric parameter. Semantics follow llama.cpp's
`src/llama-sampler.cpp` unless a class says otherwise. Imports: torch, transformers and NumPy (which
transformers depends on) only. Each class declares its traits (llama.cpp's sampler name, whether it keeps
the token ids intact) as class attributes, documented in `hfbridge/processors/_traits.py`.

| class | what it does |
| --- | --- |
| `DRYLogitsProcessor` | penalises tokens that would extend a repeated sequence |
| `XTCLogitsWarper` | sometimes removes every top choice but the least likely |
| `TopNSigmaLogitsWarper` | keeps scores within n standard deviations of the best |
| `PresenceFrequencyPenaltyLogitsProcessor` | OpenAI's presence / frequency penalties |
| `DynamicTemperatureLogitsWarper` | a temperature chosen from each row's entropy |
| `SmoothingLogitsWarper` | quadratic / cubic smoothing around the best score |
| `MirostatLogitsWarper` | mirostat 2.0: a target surprise, one state per row |
| `MirostatV1LogitsWarper` | mirostat 1.0: a Zipf estimate sets a top-k, one state per row |
| `AdaptivePLogitsWarper` | adaptive-p: favours tokens near a moving target probability |
| `ThinkingBudgetLogitsProcessor` | forces the end of a thinking span after a budget of tokens |

>>> import torch
>>> from hfbridge.processors import TopNSigmaLogitsWarper
>>> TopNSigmaLogitsWarper(1.0)(None, torch.tensor([[0.0, 1.0, 4.0]])).isfinite().tolist()
[[False, False, True]]
"""

from hfbridge.processors.adaptive_p import AdaptivePLogitsWarper
from hfbridge.processors.dry import DRYLogitsProcessor
from hfbridge.processors.dynamic_temperature import DynamicTemperatureLogitsWarper
from hfbridge.processors.mirostat import MirostatLogitsWarper
from hfbridge.processors.mirostat_v1 import MirostatV1LogitsWarper
from hfbridge.processors.penalties import PresenceFrequencyPenaltyLogitsProcessor
from hfbridge.processors.smoothing import SmoothingLogitsWarper
from hfbridge.processors.thinking_budget import ThinkingBudgetLogitsProcessor
from hfbridge.processors.top_n_sigma import TopNSigmaLogitsWarper
from hfbridge.processors.xtc import XTCLogitsWarper

__all__ = [
    "AdaptivePLogitsWarper",
    "DRYLogitsProcessor",
    "DynamicTemperatureLogitsWarper",
    "MirostatLogitsWarper",
    "MirostatV1LogitsWarper",
    "PresenceFrequencyPenaltyLogitsProcessor",
    "SmoothingLogitsWarper",
    "ThinkingBudgetLogitsProcessor",
    "TopNSigmaLogitsWarper",
    "XTCLogitsWarper",
]
