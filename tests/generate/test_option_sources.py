"""One option, four sources: a keyword, a passed `generation_config`, the model's own `generation_config` and one
value per row give the same answer (the same tokens, or the same error naming the option)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import GenerationConfig

from hfbridge import generate

from _tiny_models import model_cache

pytestmark = pytest.mark.usefixtures("one_thread")

_model = model_cache()
PROMPTS = torch.tensor([[1, 2, 3], [4, 5, 6]])
NAN, INF = float("nan"), float("inf")

# (option, value HF's own checks let through or fail on inside torch, error type, what the message says after it)
BAD = [
    ("temperature", INF, ValueError, "must be a finite number, got inf"),
    ("top_p", NAN, ValueError, "must be a finite number, got nan"),
    ("epsilon_cutoff", NAN, ValueError, "must be a finite number, got nan"),
    ("eta_cutoff", NAN, ValueError, "must be a finite number, got nan"),
    ("repetition_penalty", INF, ValueError, "must be a finite number, got inf"),
    ("top_k", True, TypeError, "must be an int, got bool True"),
    ("no_repeat_ngram_size", True, TypeError, "must be an int, got bool True"),
    ("top_k", 2.5, TypeError, "must be an int, got float 2.5"),
]


@pytest.fixture
def gpt2():
    hf = _model("gpt2")
    saved = copy.deepcopy(hf.generation_config)
    yield hf
    hf.generation_config = saved


def _call(hf, source: str, name: str, value):
    if source == "keyword":
        return generate(hf, PROMPTS, max_new_tokens=2, do_sample=True, **{name: value})
    if source == "passed config":
        config = GenerationConfig(do_sample=True)
        setattr(config, name, value)  # as it stands: HF's constructor checks some values itself
        return generate(hf, PROMPTS, max_new_tokens=2, generation_config=config)
    if source == "model's config":
        hf.generation_config.do_sample = True
        setattr(hf.generation_config, name, value)
        return generate(hf, PROMPTS, max_new_tokens=2)
    return generate(hf, PROMPTS, max_new_tokens=2, do_sample=True, **{name: [value, value]})  # one per row


@pytest.mark.parametrize("source", ["keyword", "passed config", "model's config", "per row"])
@pytest.mark.parametrize(("name", "value", "error", "says"), BAD, ids=[f"{n}={v}" for n, v, *_ in BAD])
def test_a_bad_value_gets_one_answer_from_every_source(gpt2, source, name, value, error, says):
    with pytest.raises(error) as caught:
        _call(gpt2, source, name, value)
    expected = {"keyword": f"`{name}` {says}.", "passed config": f"`{name}` {says} (in `generation_config`).",
                "model's config": f"`{name}` {says} (in the model's `generation_config`).",
                "per row": f"`{name}[0]` (row 0) {says}."}[source]
    assert str(caught.value) == expected


@pytest.mark.parametrize("kind", [list, tuple, np.array, torch.tensor])
def test_per_row_values_in_a_passed_config_are_the_keywords(gpt2, kind):
    temperatures = [0.5, 1.3]
    config = GenerationConfig(do_sample=True, temperature=kind(temperatures))
    before = copy.deepcopy(config)

    def seeded():
        return [torch.Generator().manual_seed(seed) for seed in (11, 12)]

    ours = generate(gpt2, PROMPTS, max_new_tokens=6, generation_config=config, generator=seeded())
    keyword = generate(gpt2, PROMPTS, max_new_tokens=6, do_sample=True, temperature=temperatures, generator=seeded())
    assert torch.equal(ours, keyword)
    for row, temperature in enumerate(temperatures):  # each row is HF's generate for that row's value alone
        torch.manual_seed(11 + row)
        prompt = PROMPTS[row:row + 1]
        theirs = gpt2.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=temperature,
                               max_new_tokens=6, use_cache=False, pad_token_id=0)
        assert torch.equal(ours[row:row + 1], theirs)
    assert type(config.temperature) is type(before.temperature)  # the caller's config is not modified
    assert np.array_equal(np.asarray(config.temperature), np.asarray(before.temperature))


def test_a_keyword_replaces_the_models_value_before_any_check(gpt2):
    # HF's merge takes the call's value: the model's own is never used, so it is not refused
    saved = copy.deepcopy(gpt2.generation_config)

    def run():
        return generate(gpt2, PROMPTS, max_new_tokens=4, do_sample=True, temperature=0.7, top_k=5,
                        generator=torch.Generator().manual_seed(5))

    expected = run()
    gpt2.generation_config.temperature, gpt2.generation_config.top_k = INF, True
    assert torch.equal(run(), expected)
    gpt2.generation_config = saved
