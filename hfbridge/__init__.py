"""hfbridge: Hugging Face decoding for any PyTorch language model.

>>> import torch
>>> from hfbridge import sample_step
>>> sample_step(torch.tensor([[0.0, 3.0, 1.0]])).tolist()
[1]
"""

__version__ = "0.1.0"
