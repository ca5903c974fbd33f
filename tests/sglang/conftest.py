"""SGLang tests: `test_calls.py` needs no SGLang; `test_logit_processor.py` skips where SGLang is not installed."""

import pytest
import torch
from _cases import V
from transformers import LlamaConfig, LlamaForCausalLM


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    llama = LlamaForCausalLM(config).eval()

    def logits(ids):  # [1, T] -> [1, T, V], the whole sequence every call (as `hfbridge.generate` calls it)
        with torch.no_grad():
            return llama(ids).logits

    return logits
