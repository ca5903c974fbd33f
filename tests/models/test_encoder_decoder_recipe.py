"""docs/hf_models.md's encoder-decoder recipe runs and gives `model.generate`'s tokens (greedy, sampling, beams).

An encoder-decoder model passed directly is refused, naming the recipe's route.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from hfbridge import generate

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf", "no_python_warnings")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "hf_models.md"


def _recipe() -> str:
    section = PAGE.read_text().split("## Encoder-decoder models: the decoder as a callable", 1)[1]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]


def test_the_documented_decoder_callable_equals_model_generate():
    exec(compile(_recipe(), "docs/hf_models.md", "exec"), {})  # it asserts torch.equal for each strategy


def test_an_encoder_decoder_model_passed_directly_is_refused():
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=16, d_model=8, d_kv=4, d_ff=8, num_layers=1, num_heads=2))
    with pytest.raises(TypeError, match="is an encoder-decoder model"):
        generate(t5.eval(), torch.tensor([[3, 4]]), max_new_tokens=2)
