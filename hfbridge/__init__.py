"""hfbridge: Hugging Face decoding for any PyTorch language model.

>>> import torch
>>> from hfbridge import sample_step
>>> sample_step(torch.tensor([[0.0, 3.0, 1.0]])).tolist()
[1]
"""

from ._layout import Layout, from_rows, to_rows
from ._processors import build_processors
from ._step import Sampler, sample_step

__version__ = "0.1.0"

__all__ = [
    "Layout",
    "Sampler",
    "build_processors",
    "from_rows",
    "sample_step",
    "to_rows",
]
