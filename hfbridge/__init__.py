"""hfbridge: Hugging Face decoding for any PyTorch language model.

>>> import torch
>>> from hfbridge import sample_step
>>> sample_step(torch.tensor([[0.0, 3.0, 1.0]])).tolist()
[1]
"""

from ._explain import StepTrace, explain_step
from ._generate import generate
from ._hooks import Hooks
from ._layout import Layout, from_rows, to_rows
from ._models import InputPos, ModelAdapter, Recompute, ReturnsCache
from ._processors import build_processors
from ._sample_step import sample_step
from ._step import Sampler
from ._streamers import NotebookStreamer
from ._trace import GenerationTrace, TokenStep, explain_generation
from ._transition_scores import compute_transition_scores

__version__ = "0.1.0"

__all__ = [
    "GenerationTrace",
    "Hooks",
    "InputPos",
    "Layout",
    "ModelAdapter",
    "NotebookStreamer",
    "Recompute",
    "ReturnsCache",
    "Sampler",
    "StepTrace",
    "TokenStep",
    "build_processors",
    "compute_transition_scores",
    "explain_generation",
    "explain_step",
    "from_rows",
    "generate",
    "sample_step",
    "to_rows",
]
