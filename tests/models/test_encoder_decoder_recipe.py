"""docs/hf_models.md's encoder-decoder recipe runs and gives `model.generate`'s tokens (greedy, sampling, beams).

An encoder-decoder model passed directly is refused, naming the recipe's route.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from hfbridge import ReturnsCache, generate

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


@pytest.mark.parametrize("options", [{"no_repeat_ngram_size": 1}, {"do_sample": True, "top_k": 5}],
                         ids=["greedy", "sample"])
def test_the_recipe_with_an_assistant_decoder_uses_the_passed_mask(options):
    # the decoder starts with its pad token: the draft must take the passed mask, not infer all zeros from pad_token_id
    torch.manual_seed(4)
    shared = dict(vocab_size=64, d_kv=8, num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    target = T5ForConditionalGeneration(T5Config(d_model=32, d_ff=64, num_layers=2, **shared)).eval()
    draft = T5ForConditionalGeneration(T5Config(d_model=16, d_ff=32, num_layers=1, **shared)).eval()
    source = torch.tensor([[5, 9, 13, 2, 7, 1]])
    source_mask = torch.ones_like(source)
    cache_name = "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"

    def decoder_of(model):
        encoded = model.get_encoder()(input_ids=source, attention_mask=source_mask).last_hidden_state

        def decoder(decoder_input_ids, cache, attention_mask):
            out = model(encoder_outputs=(encoded,), attention_mask=source_mask, decoder_input_ids=decoder_input_ids,
                        decoder_attention_mask=attention_mask, use_cache=True, **{cache_name: cache})
            return out.logits, getattr(out, cache_name)

        return decoder

    _, first_cache = decoder_of(draft)(torch.zeros(1, 1, dtype=torch.long), None, torch.ones(1, 1, dtype=torch.long))
    if isinstance(first_cache, tuple):  # transformers 4.46: legacy tuples, cross-attention's beside self-attention's
        pytest.skip("T5 returns a legacy tuple cache on this transformers: its cross-attention entries cannot be "
                    "cropped without a crop hook (ReturnsCache(..., crop_cache=...))")
    torch.manual_seed(0)
    theirs = target.generate(source, attention_mask=source_mask, assistant_model=draft, max_new_tokens=8, **options)
    start = torch.zeros(1, 1, dtype=torch.long)
    torch.manual_seed(0)
    ours = generate(ReturnsCache(decoder_of(target)), start, attention_mask=torch.ones_like(start),
                    assistant_model=ReturnsCache(decoder_of(draft)), max_new_tokens=8, eos_token_id=1, pad_token_id=0,
                    **options)
    assert torch.equal(ours, theirs), f"\nhfbridge:\n{ours}\nHF:\n{theirs}"
    if not options.get("do_sample"):  # the draft changes the cost, never the greedy tokens
        assert torch.equal(ours, target.generate(source, attention_mask=source_mask, max_new_tokens=8, **options))
        assert len(set(ours[0, 1:].tolist())) == 8  # a run that could differ
