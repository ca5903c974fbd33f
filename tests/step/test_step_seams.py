"""Seams of the new samplers with the step's checks: each a clear error or the plain answer.

+inf logits under mirostat and adaptive-p (whose own arithmetic turns +inf into NaN) are the
model's +inf, not a processor's NaN; a sampler option carried by a `GenerationConfig` without
`do_sample` leaves the config greedy, as every other option there does (HF's rule for its own).
"""

import pytest
import torch
from transformers import GenerationConfig

from hfbridge import Sampler, sample_step
from hfbridge._step.plan.build_processors import make_generation_config

INF = float("inf")
PLUS_INF = "`logits` contain +inf in row 1 (1 of 2 rows) while sampling"


@pytest.mark.parametrize("options", [{"mirostat": 2}, {"mirostat": 1}, {"adaptive_target": 0.3},
                                     {"adaptive_target": 0.3, "top_k": 0}, {"do_sample": True}])
@pytest.mark.parametrize("fast", [False, True])
def test_plus_inf_logits_are_the_models_under_every_sampler(options, fast):
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [INF, 0.0, INF, 1.0]])  # row 1: the model's +inf
    with pytest.raises(ValueError, match=r"^" + PLUS_INF.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        sample_step(logits, torch.tensor([[1], [2]]), generator=torch.Generator().manual_seed(0), fast=fast, **options)


def test_nan_made_by_a_processor_from_finite_logits_still_names_the_processors():
    def to_nan(input_ids, scores):
        return scores * torch.tensor([1.0, 0.0, 1.0, 1.0]) / torch.tensor([1.0, 0.0, 1.0, 1.0])  # 0 / 0 in column 1

    with pytest.raises(ValueError, match=r"the logits processors \[.*to_nan.*\] turned row 0 into NaN"):
        Sampler(do_sample=True, processors=[to_nan])(torch.zeros(1, 4), torch.tensor([[1]]))


@pytest.mark.parametrize("option", [{"mirostat": 1}, {"mirostat": 2}, {"top_n_sigma": 1.0}, {"adaptive_target": 0.4},
                                    {"xtc_probability": 0.5}])
def test_a_sampler_option_in_a_config_without_do_sample_is_greedy_like_the_others(option):
    # HF: a GenerationConfig's own do_sample (None: greedy) decides; keywords turn sampling on
    assert make_generation_config(GenerationConfig(**option)).do_sample is False
    assert make_generation_config(GenerationConfig(top_k=4)).do_sample is False
    assert make_generation_config(GenerationConfig(do_sample=True, **option)).do_sample is True
    assert make_generation_config(**option).do_sample is True


@pytest.mark.parametrize("prompt_length", [None, 0])
def test_no_inputs_embeds_warning_for_a_step_without_a_prompt(prompt_length):
    # HF's builder warns "Passing `repetition_penalty` with `inputs_embeds`" for a missing or zero length; a step
    # (or an engine's check of a request, which builds with prompt_length=0) is not generating from embeddings
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler = Sampler(repetition_penalty=1.3, no_repeat_ngram_size=2, prompt_length=prompt_length)
    assert [type(p).__name__ for p in sampler.processors] == [
        "RepetitionPenaltyLogitsProcessor", "NoRepeatNGramLogitsProcessor"]
