"""sample_step and Sampler: HF's tokens, any output form, padded vocabularies, exact errors."""

import re
from types import SimpleNamespace

import pytest
import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process as hf
from transformers.modeling_outputs import CausalLMOutput

from hfbridge import Sampler, sample_step

V = 50


def logits_3d(seed=0, batch=3, seq=4, vocab=V, dtype=torch.float32):
    return torch.randn(batch, seq, vocab, generator=torch.Generator().manual_seed(seed)).to(dtype)


def context(seed=0, batch=3, seq=6, vocab=V):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed + 100))


def hand_written_hf(logits, input_ids, processors, do_sample):
    """What users write today with HF's classes."""
    scores = logits[:, -1, :].to(torch.float32)
    scores = LogitsProcessorList(processors)(input_ids, scores)
    if not do_sample:
        return scores.argmax(dim=-1)
    probs = torch.nn.functional.softmax(scores, dim=-1)
    return torch.multinomial(probs, num_samples=1).squeeze(1)


CHAINS = [
    ({}, [], False),
    ({"repetition_penalty": 1.5}, [hf.RepetitionPenaltyLogitsProcessor(1.5)], False),
    ({"temperature": 0.6, "top_k": 0}, [hf.TemperatureLogitsWarper(0.6)], True),
    ({"temperature": 0.8, "top_k": 10}, [hf.TemperatureLogitsWarper(0.8), hf.TopKLogitsWarper(10)], True),
    ({"top_p": 0.9, "top_k": 0}, [hf.TopPLogitsWarper(0.9)], True),
    ({"min_p": 0.05, "top_k": 0}, [hf.MinPLogitsWarper(0.05)], True),
    ({"repetition_penalty": 1.2, "temperature": 0.7, "top_k": 20, "top_p": 0.95},
     [hf.RepetitionPenaltyLogitsProcessor(1.2), hf.TemperatureLogitsWarper(0.7), hf.TopKLogitsWarper(20),
      hf.TopPLogitsWarper(0.95)], True),
    ({"no_repeat_ngram_size": 2, "typical_p": 0.9, "top_k": 0},
     [hf.NoRepeatNGramLogitsProcessor(2), hf.TypicalLogitsWarper(0.9)], True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("options, chain, do_sample", CHAINS)
def test_same_tokens_as_hand_written_hf_chain(options, chain, do_sample, dtype):
    for seed in range(3):
        logits, ids = logits_3d(seed, dtype=dtype), context(seed)
        torch.manual_seed(seed)
        expected = hand_written_hf(logits, ids, chain, do_sample)
        torch.manual_seed(seed)
        assert torch.equal(sample_step(logits, ids, **options), expected)


def test_sampler_matches_sample_step_over_many_steps():
    sampler = Sampler(temperature=0.9, top_p=0.9)
    built = sampler.processors
    for seed in range(5):
        torch.manual_seed(seed)
        first = sampler(logits_3d(seed), context(seed))
        torch.manual_seed(seed)
        assert torch.equal(first, sample_step(logits_3d(seed), context(seed), temperature=0.9, top_p=0.9))
    assert sampler.processors is built  # built once, reused


def test_generator_is_reproducible_and_leaves_global_rng_alone():
    logits = logits_3d(1, batch=8)
    state = torch.get_rng_state()
    a = sample_step(logits, generator=torch.Generator().manual_seed(7), temperature=1.3)
    b = sample_step(logits, generator=torch.Generator().manual_seed(7), temperature=1.3)
    assert torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize(
    "wrap",
    [lambda x: x, lambda x: (x, "cache"), lambda x: [x], lambda x: {"logits": x, "loss": None},
     lambda x: CausalLMOutput(logits=x), lambda x: SimpleNamespace(logits=x)],
    ids=["tensor", "tuple", "list", "dict", "ModelOutput", "attribute"],
)
def test_model_output_forms(wrap):
    logits = logits_3d(2)
    assert torch.equal(sample_step(wrap(logits)), logits[:, -1].argmax(-1))


def test_padded_vocabulary_is_never_chosen():
    logits = logits_3d(3, vocab=64)
    logits[..., 50:] = 100.0  # the padding columns would win
    ids = context(3)
    greedy = sample_step(logits, ids, vocab_size=50)
    assert torch.equal(greedy, logits[:, -1, :50].argmax(-1))
    torch.manual_seed(0)
    sampled = torch.stack([sample_step(logits, ids, vocab_size=50, temperature=2.0) for _ in range(50)])
    assert int(sampled.max()) < 50


def test_padded_vocabulary_sampling_equals_hf_on_the_trimmed_logits():
    logits, ids = logits_3d(4, vocab=64), context(4)
    torch.manual_seed(5)
    expected = hand_written_hf(logits[..., :50], ids, [hf.TemperatureLogitsWarper(0.7), hf.TopKLogitsWarper(50)], True)
    torch.manual_seed(5)
    assert torch.equal(sample_step(logits, ids, vocab_size=50, temperature=0.7), expected)


def test_unbatched_layouts_return_0d():
    logits = torch.randn(4, V)
    token = sample_step(logits, torch.tensor([1, 2, 3]), layout="t v", repetition_penalty=1.3)
    assert token.shape == () and token.dtype == torch.long
    assert sample_step(logits[-1], layout="v").shape == ()


def test_codebooks_are_sampled_per_row_with_their_own_context():
    logits = torch.randn(2, 3, 4, V, generator=torch.Generator().manual_seed(0))  # [B, K, T, V]
    ids = torch.randint(0, V, (2, 3, 5), generator=torch.Generator().manual_seed(1))  # [B, K, T]
    tokens = sample_step(logits, ids, layout="b k t v", repetition_penalty=2.0)
    assert tokens.shape == (2, 3)
    for b in range(2):
        for k in range(3):
            row = sample_step(logits[b, k], ids[b, k], layout="t v", repetition_penalty=2.0)
            assert int(tokens[b, k]) == int(row)


class InPlace:
    """A processor that writes into its input, as some HF processors do."""

    def __call__(self, input_ids, scores):
        scores[:, 0] = float("-inf")
        input_ids[:, 0] = 0
        return scores


STEP_OPTIONS = [
    {"repetition_penalty": 1.3}, {"no_repeat_ngram_size": 2}, {"bad_words_ids": [[3], [4, 5]]},
    {"sequence_bias": {(7,): 3.0}}, {"min_length": 20, "eos_token_id": 2},
    {"min_new_tokens": 3, "eos_token_id": 2, "prompt_length": 4}, {"forced_bos_token_id": 1},
    {"forced_eos_token_id": 2, "max_length": 7}, {"suppress_tokens": [1, 2]},
    {"begin_suppress_tokens": [1], "prompt_length": 6},
    {"exponential_decay_length_penalty": (1, 1.2), "eos_token_id": 2, "prompt_length": 3},
    {"remove_invalid_values": True}, {"renormalize_logits": True}, {"temperature": 0.5}, {"top_k": 3},
    {"top_p": 0.5}, {"min_p": 0.2}, {"typical_p": 0.5}, {"epsilon_cutoff": 0.01}, {"eta_cutoff": 0.01},
    {"processors": [InPlace()]}, {"fast": True, "temperature": 0.8, "top_p": 0.9},
]


@pytest.mark.parametrize("options", STEP_OPTIONS, ids=lambda o: ",".join(o))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_caller_tensors_are_untouched(options, dtype):
    logits, ids = logits_3d(5, dtype=dtype), context(5)
    logits[0, -1, 3] = float("inf") if options.get("remove_invalid_values") else logits[0, -1, 3]
    logits_before, ids_before = logits.clone(), ids.clone()
    sample_step(logits, ids, **options)
    assert torch.equal(logits, logits_before)
    assert torch.equal(ids, ids_before)


def test_output_follows_the_logits_device_and_dtype():
    tokens = sample_step(logits_3d(0), context(0))
    assert tokens.dtype == torch.long and tokens.device == torch.device("cpu") and tokens.shape == (3,)


# ---- errors: each names the argument, what it got and what it expected ----

def test_nan_names_the_row():
    logits = logits_3d(0)
    logits[2, -1, 5] = float("nan")
    with pytest.raises(ValueError) as error:
        sample_step(logits)
    assert str(error.value) == (
        "`logits` contain NaN in row 2 (1 of 3 rows have NaN); check the model's forward pass "
        "(NaN comes from inf - inf, 0 * inf or 0 / 0 upstream)."
    )


def test_nan_in_an_earlier_position_is_fine():
    logits = logits_3d(0)
    logits[:, 0, :] = float("nan")
    assert sample_step(logits).shape == (3,)


def test_batch_mismatch_gives_both_sizes():
    with pytest.raises(ValueError) as error:
        sample_step(logits_3d(0), context(0, batch=2))
    assert str(error.value) == (
        "`input_ids` of shape (2, 6) do not match the logits: expected (3, 'seq') (logits batch (3,), 3 rows), "
        "got batch (2,)."
    )


def test_float_input_ids():
    with pytest.raises(TypeError, match=re.escape("`input_ids` must hold integer token ids, got dtype torch.float32.")):
        sample_step(logits_3d(0), context(0).float())


def test_input_ids_not_a_tensor():
    with pytest.raises(TypeError, match=re.escape("`input_ids` must be a tensor of token ids, got list.")):
        sample_step(logits_3d(0), [[1, 2]])


def test_token_id_beyond_the_vocabulary():
    ids = context(0)
    ids[1, 2] = 50
    with pytest.raises(ValueError) as error:
        sample_step(logits_3d(0, vocab=64), ids, vocab_size=50)
    assert str(error.value) == (
        "`input_ids` hold token id 50, outside the vocabulary of 50 tokens (ids must be in [0, 50); vocab_size=50)."
    )


def test_errors_say_the_fix_for_one_d_and_vocab_first_logits():
    with pytest.raises(ValueError) as error:
        sample_step(torch.randn(5), torch.tensor([[1, 2]]))  # one row of logits, a batch of input_ids
    assert str(error.value) == (
        "`input_ids` of shape (1, 2) do not match the logits: expected ('seq',) (logits batch (), 1 rows), got "
        "batch (1,). 1-D logits (vocab,) are one row, whose input_ids are 1-D (seq,): pass input_ids[0], or "
        "logits[None] for a batch of one."
    )
    logits = torch.randn(1, 300, 3)  # [B, V, T]: read as [B, T, V] by default, a vocabulary of 3
    with pytest.raises(ValueError) as error:
        sample_step(logits, torch.tensor([[275, 2, 1]]))
    assert str(error.value) == (
        "`input_ids` hold token id 275, outside the vocabulary of 3 tokens (ids must be in [0, 3); vocab_size=None). "
        "The vocabulary is read from the logits' last axis (3); if it is another axis (logits [batch, vocab, seq]), "
        'say so with layout=, e.g. layout="b v t".'
    )
    assert torch.equal(sample_step(logits, torch.tensor([[275, 2, 1]]), layout="b v t"),
                       logits[:, :, -1].argmax(-1))  # the fix the message names


def test_negative_token_id():
    ids = context(0)
    ids[0, 0] = -1
    with pytest.raises(ValueError, match=re.escape("`input_ids` hold token id -1, outside the vocabulary of 50 tokens")):
        sample_step(logits_3d(0), ids)


def test_vocab_size_larger_than_the_logits():
    with pytest.raises(ValueError) as error:
        sample_step(logits_3d(0), vocab_size=51)
    assert str(error.value) == "`vocab_size`=51 but the logits have only 50 vocabulary columns (shape (3, 4, 50))."


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_vocab_size_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match=re.escape(f"`vocab_size` must be a positive int, got {bad!r}.")):
        sample_step(logits_3d(0), vocab_size=bad)


def test_generator_on_another_device():
    logits = torch.zeros(2, 5, device="meta")
    with pytest.raises(ValueError) as error:
        sample_step(logits, generator=torch.Generator(), temperature=0.5)
    assert str(error.value) == (
        "`generator` is on cpu but the logits are on meta; create it with torch.Generator(device='meta')."
    )


def test_generator_type():
    with pytest.raises(TypeError, match=re.escape("`generator` must be a torch.Generator or a list of them (one per row), got int.")):
        sample_step(logits_3d(0), generator=3)


def test_input_ids_on_another_device():
    with pytest.raises(ValueError, match=re.escape("`input_ids` are on meta but the logits are on cpu; move one of them.")):
        sample_step(logits_3d(0), torch.zeros(3, 2, dtype=torch.long, device="meta"))


def test_every_token_removed_names_the_processors():
    with pytest.raises(ValueError) as error:
        sample_step(torch.zeros(2, 3), suppress_tokens=[0, 1, 2], temperature=0.5)
    assert str(error.value) == (
        "the logits processors ['SuppressTokensLogitsProcessor', 'TemperatureLogitsWarper', 'TopKLogitsWarper'] "
        "removed every token of row 0: nothing is left to choose (a row can also start all -inf or NaN). "
        "Relax the options, e.g. `bad_words_ids`, `suppress_tokens` or `min_p`."
    )


def test_logits_of_integer_dtype():
    with pytest.raises(TypeError, match=re.escape("`logits` must be a floating-point tensor, got dtype torch.int64.")):
        sample_step(torch.zeros(2, 3, dtype=torch.long))


def test_logits_of_unknown_type():
    with pytest.raises(TypeError, match=re.escape("`logits` must be a tensor, a tuple/list whose first element is one")):
        sample_step("logits")


def test_mapping_without_logits():
    with pytest.raises(TypeError, match=re.escape("`logits` is a mapping without a 'logits' key (keys: ['scores'])")):
        sample_step({"scores": torch.zeros(1, 3)})


def test_layout_error_quotes_layout_and_shape():
    with pytest.raises(ValueError, match=re.escape("`layout` 'b k t v' names 4 axes but the logits have shape (3, 4, 50)")):
        sample_step(logits_3d(0), layout="b k t v")


def test_sample_step_reuses_its_processors_across_calls():
    from hfbridge._step.run import sample_step as _sample_step

    logits, ids = logits_3d(0), context(0)
    sample_step(logits, ids, temperature=0.9, top_p=0.8, bad_words_ids=[[1], [2, 3]])
    cached = dict(_sample_step._SAMPLER_CACHE)
    sample_step(logits_3d(1), context(1), temperature=0.9, top_p=0.8, bad_words_ids=[[1], [2, 3]])
    assert cached == _sample_step._SAMPLER_CACHE  # nothing rebuilt


def test_reused_processors_follow_the_vocabulary_width():
    # SequenceBias prepares its bias tensor for the first vocabulary it sees.
    for vocab in (20, 30, 20):
        logits = torch.zeros(2, 1, vocab)
        assert sample_step(logits, sequence_bias={(5,): 3.0}).tolist() == [5, 5]


def test_generator_of_one_call_does_not_stick_to_the_next():
    logits = logits_3d(1, batch=8)
    sample_step(logits, generator=torch.Generator().manual_seed(7), temperature=1.3)
    torch.manual_seed(11)
    expected = hand_written_hf(logits, None, [hf.TemperatureLogitsWarper(1.3), hf.TopKLogitsWarper(50)], True)
    torch.manual_seed(11)
    assert torch.equal(sample_step(logits, temperature=1.3), expected)
