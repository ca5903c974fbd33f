"""hfbridge: Hugging Face decoding for any PyTorch language model.

>>> import torch
>>> from hfbridge import sample_step
>>> sample_step(torch.tensor([[0.0, 3.0, 1.0]])).tolist()
[1]
"""

from hfbridge._generate.banned import BannedStrings
from hfbridge._generate.custom_generate import custom_generate
from hfbridge._generate.generate import generate
from hfbridge._generate.logprobs import logprobs
from hfbridge._generate.replay import replay
from hfbridge._generate.replay_result import Replay
from hfbridge._generate.transition_scores import compute_transition_scores
from hfbridge._hf.contracts import TransformersContractError
from hfbridge._models.adapters import InputPos, ModelAdapter, Recompute
from hfbridge._models.cache import crop_cache, reorder_cache
from hfbridge._models.hooks import Hooks
from hfbridge._models.returns_cache import ReturnsCache
from hfbridge._step.plan.build_processors import build_processors
from hfbridge._step.run.cpu_shortcuts import accelerator_route
from hfbridge._step.run.layout import Layout, from_rows, to_rows
from hfbridge._step.run.sample_step import sample_step
from hfbridge._step.run.sampler import Sampler
from hfbridge._views.compare import GenerationComparison, StepComparison, compare_generation, compare_step
from hfbridge._views.explain_generation import GenerationTrace, TokenStep, explain_generation
from hfbridge._views.explain_step import StepTrace, explain_step
from hfbridge._views.streamers import NotebookStreamer

__version__ = "0.2.0"

__all__ = [
    "BannedStrings",
    "GenerationComparison",
    "GenerationTrace",
    "Hooks",
    "InputPos",
    "Layout",
    "ModelAdapter",
    "NotebookStreamer",
    "Recompute",
    "Replay",
    "ReturnsCache",
    "Sampler",
    "StepComparison",
    "StepTrace",
    "TokenStep",
    "TransformersContractError",
    "accelerator_route",
    "build_processors",
    "compare_generation",
    "compare_step",
    "compute_transition_scores",
    "crop_cache",
    "custom_generate",
    "explain_generation",
    "explain_step",
    "from_rows",
    "generate",
    "logprobs",
    "reorder_cache",
    "replay",
    "sample_step",
    "to_rows",
]
