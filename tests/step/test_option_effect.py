"""An option that only tunes a processor another option switches on does nothing alone: it builds nothing, does not
turn sampling on, and says so (a `UserWarning` naming it and its switch), as transformers warns for a sampling
option without `do_sample`. The population is the registry's: every row whose effect depends on another."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from transformers import GenerationConfig

from hfbridge import Sampler, generate, sample_step
from hfbridge._step.plan.option_table import ROWS, switches_of

pytestmark = pytest.mark.usefixtures("one_thread")

V = 24
DEPENDENT = [name for name in ROWS if switches_of(name)]


def _value(name: str):
    """A valid value of the option: its default, else its lowest bound, else one token id (a message's)."""
    row = ROWS[name]
    if row.default is not None:
        return row.default
    if "minimum" in row.bounds:
        return int(row.bounds["minimum"]) if row.integer else row.bounds["minimum"]
    return [1]


def _idle_warning(name: str, where: str = "") -> str:
    switches = switches_of(name)
    either = " or ".join([", ".join(f"`{s}`" for s in switches[:-1]), f"`{switches[-1]}`"]) if len(switches) > 1 \
        else f"`{switches[0]}`"
    return rf"^`{name}` is set to .*{re.escape(where)}, but it only tunes .*, which {re.escape(either)} turns on: " \
           rf"alone it does nothing.*Set {re.escape(either)}, or unset `{name}`\.$"


def test_the_population_is_every_tuning_option_of_the_registry():
    # a switch, HF's options and the chain's order act alone; everything else of the samplers tunes a switch's
    expected = {name for name, row in ROWS.items() if row.community and not row.switch and row.place != "order"}
    assert set(DEPENDENT) == expected
    assert {"xtc_threshold", "mirostat_tau", "dry_base", "penalty_last_n", "thinking_start"} <= expected


@pytest.mark.parametrize("name", DEPENDENT)
def test_an_option_without_its_switch_does_nothing_and_says_so(name):
    x = torch.randn(3, V, generator=torch.Generator().manual_seed(0)) * 3
    ids = torch.randint(0, V, (3, 4), generator=torch.Generator().manual_seed(1))
    value = _value(name)
    with pytest.warns(UserWarning, match=_idle_warning(name)):
        sampler = Sampler(**{name: value})
    plain = Sampler()
    assert sampler.do_sample is False  # greedy, as with no option at all
    assert [type(p) for p in sampler.processors] == [type(p) for p in plain.processors] == []
    with pytest.warns(UserWarning, match=_idle_warning(name)):
        tokens = sample_step(x, ids, generator=torch.Generator().manual_seed(2), **{name: value})
    assert torch.equal(tokens, x.argmax(-1))
    with pytest.warns(UserWarning, match=_idle_warning(name, " in `generation_config`")):  # the same in a config
        configured = Sampler(GenerationConfig(**{name: value}))
    assert configured.do_sample is False and list(configured.processors) == []


@pytest.mark.parametrize(("options", "built"), [
    (dict(xtc_threshold=0.2, xtc_probability=0.5), ["TopKLogitsWarper", "XTCLogitsWarper"]),
    (dict(mirostat=2, mirostat_tau=3.0), ["MirostatLogitsWarper"]),
    (dict(dry_multiplier=0.8, dry_base=2.0, dry_sequence_breakers=[]), ["DRYLogitsProcessor"]),
    (dict(repetition_penalty=1.2, penalty_last_n=8), ["PresenceFrequencyPenaltyLogitsProcessor"]),
])
def test_with_its_switch_an_option_tunes_without_a_warning(options, built):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler = Sampler(**options)
    assert [type(p).__name__ for p in sampler.processors] == built


def test_a_switch_in_a_passed_config_gives_the_keyword_its_effect():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler = Sampler(GenerationConfig(mirostat=2), mirostat_tau=2.0)
    assert sampler.do_sample is True
    assert [type(p).__name__ for p in sampler.processors] == ["MirostatLogitsWarper"]
    assert float(sampler.processors[0].tau.values[0]) == 2.0


def test_generate_with_xtc_threshold_alone_is_greedy_and_warns():
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(3))

    def model(input_ids):
        return table[input_ids]

    prompt = torch.tensor([[1, 2]])
    with pytest.warns(UserWarning, match=_idle_warning("xtc_threshold")):
        out = generate(model, prompt, max_new_tokens=5, xtc_threshold=0.1)
    assert torch.equal(out, generate(model, prompt, max_new_tokens=5))


def test_a_switch_set_to_off_is_no_mistake_to_warn_about():
    # llama.cpp-style settings pass every option, switches off included: the tuning option still does nothing, the
    # switch passed is a sampling option passed (as `top_k=0` is), and no warning is due
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler = Sampler(xtc_threshold=0.1, xtc_probability=0.0)
    assert sampler.do_sample is True
    assert [type(p).__name__ for p in sampler.processors] == ["TopKLogitsWarper"]


def test_a_keyword_switch_gives_a_passed_configs_option_its_effect():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler = Sampler(GenerationConfig(xtc_threshold=0.2), xtc_probability=0.5)
    assert [type(p).__name__ for p in sampler.processors] == ["TopKLogitsWarper", "XTCLogitsWarper"]
    assert float(sampler.processors[1].threshold.values[0]) == 0.2
