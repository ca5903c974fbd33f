"""A new sampler is one `LogitsProcessor` class (its traits declared on it: `hfbridge/processors/_traits.py`) plus
its row in the option registry, and then works through every entry point: keywords, a `GenerationConfig`, per-row
values, `explain_step`, `sampler_order`, the step's uncopied ids (fast path included), hfbridge's `generate` and
transformers' own `generate`. The sampler here is an example written for this test: this module is its "new
module", `ROW` its one row, and nothing else in hfbridge changes."""

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor, TemperatureLogitsWarper

from hfbridge import Sampler, explain_step, generate, sample_step
from hfbridge._step.plan.option_table import OptionRow, register, unregister
from hfbridge.processors._rows import RowParam

from _tiny_models import tiny_gpt2


class TopDampLogitsWarper(LogitsProcessor):
    """Lowers each row's best score by `amount` (a warper: it applies when sampling). One value, or one per row."""

    keeps_ids_intact = True  # traits: it reads no ids at all, so the step need not copy the caller's
    sampler_name = "top_damp"  # `sampler_order`'s name for it

    def __init__(self, amount=0.0):
        self.amount = RowParam("amount", amount, minimum=0.0)

    def __call__(self, input_ids, scores):
        amount = self.amount.tensor(scores.shape[0], scores.device, scores.dtype)[:, None]  # [B, 1]
        best = scores.argmax(-1, keepdim=True)
        return scores.scatter(1, best, scores.gather(1, best) - amount)


ROW = OptionRow("top_damp", TopDampLogitsWarper, argument="amount", off=0.0, default=0.0, switch=True,
                sampling=True, bounds={"minimum": 0.0}, place="after_temperature")
@pytest.fixture(autouse=True)
def registered():
    register(ROW)
    yield
    unregister("top_damp")


def G(seed):
    return torch.Generator().manual_seed(seed)


def reference(x, amount, seed):
    """The class alone on the scores, then HF's draw (softmax, multinomial)."""
    scores = TopDampLogitsWarper(amount)(None, x.clone())
    return torch.multinomial(torch.softmax(scores, -1), 1, generator=G(seed)).squeeze(1)


X = torch.tensor([[4.0, 3.0, 0.0, -1.0], [1.0, 3.5, 3.0, 0.0]])


def test_keyword():
    assert torch.equal(sample_step(X, top_damp=2.0, top_k=0, generator=G(1)), reference(X, 2.0, 1))


def test_generation_config():
    config = GenerationConfig(top_damp=2.0, top_k=0, do_sample=True)
    assert torch.equal(sample_step(X, generation_config=config, generator=G(1)), reference(X, 2.0, 1))


def test_per_row_values():
    got = sample_step(X, top_damp=[0.0, 3.0], top_k=0, generator=[G(1), G(2)])
    assert got.tolist() == [int(reference(X[r:r + 1], [0.0, 3.0][r], 1 + r)) for r in range(2)]


def test_checks_name_the_option():
    with pytest.raises(ValueError) as error:
        sample_step(X, top_damp=-1.0)
    assert str(error.value) == "`top_damp` must be >= 0.0, got -1.0."
    with pytest.raises(ValueError) as error:
        sample_step(X, generation_config=GenerationConfig(top_damp=[1.0, float("nan")]))
    assert str(error.value) == "`top_damp[1]` (row 1) must be a finite number, got nan (in `generation_config`)."


def test_explain_step():
    trace = explain_step(X, top_damp=2.0, top_k=0, generator=G(1), row=1)
    assert [stage.name.rsplit(".", 1)[-1] for stage in trace.stages] == ["input", "TopDampLogitsWarper"]
    assert trace.token == int(reference(X, 2.0, 1)[1])


def test_generate_and_transformers_generate():
    model = tiny_gpt2()
    prompt = torch.tensor([[5, 9, 13]])
    torch.manual_seed(0)
    theirs = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, max_new_tokens=5,
                            logits_processor=[TopDampLogitsWarper(3.0)], pad_token_id=0)
    torch.manual_seed(0)
    ours = generate(model, prompt, max_new_tokens=5, do_sample=True, top_damp=3.0, pad_token_id=0)
    assert torch.equal(ours, theirs)


def draw(scores, seed):
    """HF's draw (softmax, multinomial) from processed scores."""
    return torch.multinomial(torch.softmax(scores, -1), 1, generator=G(seed)).squeeze(1)


def test_sampler_order_moves_it_by_its_declared_name():
    damp, temperature = TopDampLogitsWarper(2.0), TemperatureLogitsWarper(0.5)
    after = draw(damp(None, temperature(None, X.clone())), 3)  # its place: right after the temperature
    before = draw(temperature(None, damp(None, X.clone())), 3)
    assert torch.equal(sample_step(X, top_damp=2.0, temperature=0.5, top_k=0, generator=G(3)), after)
    got = sample_step(X, top_damp=2.0, temperature=0.5, top_k=0, sampler_order="top_damp;temperature", generator=G(3))
    assert torch.equal(got, before)
    trace = explain_step(X, top_damp=2.0, temperature=0.5, top_k=0, sampler_order=["top_damp", "temperature"], row=0)
    assert [stage.name.rsplit(".", 1)[-1] for stage in trace.stages] == [
        "input", "TopDampLogitsWarper", "TemperatureLogitsWarper"]
    with pytest.raises(ValueError) as error:
        sample_step(X, top_damp=2.0, top_k=0, sampler_order="temperature")
    assert str(error.value) == ("`sampler_order` leaves out 'top_damp', which the options turn on "
                                "(TopDampLogitsWarper, from `top_damp`): add 'top_damp' to the order, or turn it off.")


class Writer(TopDampLogitsWarper):
    """A user's subclass that writes the ids: it does not inherit the trait `keeps_ids_intact`."""

    def __call__(self, input_ids, scores):
        input_ids[:, 0] = 0
        return super().__call__(input_ids, scores)


@pytest.mark.parametrize("fast", [False, True])
def test_the_callers_ids_are_passed_uncopied_by_its_trait(fast):
    logits = torch.randn(2, 40, generator=G(0))
    ids = torch.randint(0, 40, (2, 5), generator=G(1))
    before = ids.clone()
    sampler = Sampler(top_damp=2.0, top_k=0, do_sample=True, fast=fast, generator=G(2))
    assert sampler.prepare(logits, ids)[1].data_ptr() == ids.data_ptr()  # no copy: its class says it keeps them
    sampler(logits, ids)
    assert torch.equal(ids, before)
    writer = Sampler(processors=[Writer(1.0)], do_sample=True, top_k=0, fast=fast, generator=G(2))
    assert writer.prepare(logits, ids)[1].data_ptr() != ids.data_ptr()  # a subclass: copied
    writer(logits, ids)
    assert torch.equal(ids, before)
