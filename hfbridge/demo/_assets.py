"""Loading the shipped demo weights and tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hfbridge.demo._model import DemoConfig, DemoLM

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["ASSET_DIR", "EOS_TOKEN", "PAD_TOKEN", "load_demo_model", "load_demo_tokenizer"]

ASSET_DIR = Path(__file__).resolve().parent
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def _asset(name: str) -> Path:
    path = ASSET_DIR / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the installed package; rebuild it with `python -m hfbridge.demo.train`"
        )
    return path


def load_demo_model(device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> DemoLM:
    """The small trained :class:`DemoLM` shipped with hfbridge, in eval mode.

    Args:
        device: Where to put the weights. Default: CPU.
        dtype: Parameter dtype. Default: ``torch.float32``.

    >>> model = load_demo_model()
    >>> model(torch.tensor([[1, 2]])).shape[-1] == model.config.vocab_size
    True
    """
    checkpoint = torch.load(_asset("model.pt"), map_location="cpu", weights_only=True)
    model = DemoLM(DemoConfig(**checkpoint["config"]))
    model.load_state_dict({k: v.float() for k, v in checkpoint["state_dict"].items()})
    return model.to(device=device, dtype=dtype).eval()


def load_demo_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level BPE tokenizer of the demo model, as a ``PreTrainedTokenizerFast``.

    ``eos_token`` is ``<|endoftext|>``, ``pad_token`` is ``<|pad|>`` and padding is on the
    left, as generation wants.

    >>> tok = load_demo_tokenizer()
    >>> tok.decode(tok("The model").input_ids)
    'The model'
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(_asset("tokenizer.json")),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
