"""hfbridge.logprobs: OpenAI's chat logprobs from a generate output."""

import pytest
import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

import hfbridge
from hfbridge import explain_generation, generate, logprobs

from _tiny_models import tiny_gpt2


class _Tokenizer:
    """Decodes id i as a fixed string (one non-ASCII), enough for `token` and `bytes`."""

    eos_token_id = None
    pad_token_id = None

    def decode(self, ids):
        return "".join("é" if i == 5 else f"<{i}>" for i in ids)


def _output(**options):
    model = tiny_gpt2()
    prompts = torch.randint(0, 48, (2, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return generate(model, prompts, max_new_tokens=4, return_dict_in_generate=True, output_scores=True,
                        output_logits=True, **options)


@pytest.mark.parametrize("kind", ["processed", "raw"])
def test_logprobs_are_log_softmax_of_the_scores_or_logits(kind):
    out = _output(temperature=[0.5, 1.5], top_k=10, generator=[torch.Generator().manual_seed(i) for i in (1, 2)])
    result = logprobs(out, top_logprobs=3, kind=kind)
    per_step = out.scores if kind == "processed" else out.logits
    assert len(result) == 2
    for row, entry in enumerate(result):
        assert len(entry["content"]) == 4
        for step, item in enumerate(entry["content"]):
            expected = torch.log_softmax(per_step[step][row].float(), dim=-1)
            token = int(out.sequences[row, 4 + step])
            assert item["token"] == str(token) and item["bytes"] == list(str(token).encode())
            assert item["logprob"] == float(expected[token])
            values = [alt["logprob"] for alt in item["top_logprobs"]]
            assert values == sorted(values, reverse=True) and len(values) == 3
            assert values == expected.topk(3).values.tolist()
            assert [alt["token"] for alt in item["top_logprobs"]] == [str(i) for i in expected.topk(3).indices.tolist()]


def test_removed_tokens_are_no_alternatives_and_bytes_are_utf8():
    scores = (torch.tensor([[0.0, float("-inf"), 1.0, float("-inf"), float("-inf"), 2.0]]),)
    out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[0, 5]]), scores=scores)
    item = logprobs(out, _Tokenizer(), top_logprobs=6)[0]["content"][0]
    assert item["token"] == "é" and item["bytes"] == [0xC3, 0xA9]
    assert [alt["token"] for alt in item["top_logprobs"]] == ["é", "<2>", "<0>"]


def test_padding_after_a_rows_end_is_left_out():
    # row 0 ends with eos 3 at its first step; the rest is the filler
    scores = tuple(torch.zeros(2, 6) for _ in range(3))
    out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[1, 3, 3, 3], [1, 2, 4, 2]]), scores=scores)
    result = logprobs(out, eos_token_id=3)
    assert [item["token"] for item in result[0]["content"]] == ["3"]
    assert [item["token"] for item in result[1]["content"]] == ["2", "4", "2"]


def test_beams_follow_beam_indices():
    out = _output(num_beams=2, num_return_sequences=2, do_sample=False)
    result = logprobs(out, top_logprobs=1)
    for row, entry in enumerate(result):
        sources = out.beam_indices[row].tolist()
        kept = [s for s in sources if s >= 0]
        assert len(entry["content"]) == len(kept)
        new = out.sequences.shape[1] - len(kept)
        for step, (item, source) in enumerate(zip(entry["content"], kept)):
            expected = torch.log_softmax(out.scores[step][source].float(), dim=-1)
            assert item["logprob"] == float(expected[int(out.sequences[row, new + step])])


def test_missing_scores_or_logits_name_the_flag():
    model = tiny_gpt2()
    prompts = torch.randint(0, 48, (1, 3))
    with torch.no_grad():
        plain = generate(model, prompts, max_new_tokens=2, return_dict_in_generate=True)
        scores_only = generate(model, prompts, max_new_tokens=2, return_dict_in_generate=True, output_scores=True)
    with pytest.raises(ValueError, match="pass output_scores=True"):
        logprobs(plain)
    with pytest.raises(ValueError, match="pass output_logits=True"):
        logprobs(scores_only, kind="raw")
    with pytest.raises(ValueError, match="`kind` must be 'processed'"):
        logprobs(scores_only, kind="model")
    with pytest.raises(ValueError, match=r"`top_logprobs` must be an int in \[0, 48\]"):
        logprobs(scores_only, top_logprobs=-1)
    with pytest.raises(TypeError, match="logprobs needs the output"):
        logprobs(prompts)


def test_the_trace_exports_the_same():
    out = _output(do_sample=True, top_k=5, generator=torch.Generator().manual_seed(3))
    exported = logprobs(out, top_logprobs=2)
    for row in range(2):
        trace = explain_generation(out, row=row)
        mine = trace.logprobs(top_logprobs=2)
        assert [item["token"] for item in mine["content"]] == [item["token"] for item in exported[row]["content"]]
        assert [item["logprob"] for item in mine["content"]] == [item["logprob"] for item in exported[row]["content"]]
        for a, b in zip(mine["content"], exported[row]["content"]):
            assert [x["token"] for x in a["top_logprobs"]] == [x["token"] for x in b["top_logprobs"]]
            assert [x["logprob"] for x in a["top_logprobs"]] == pytest.approx([x["logprob"] for x in b["top_logprobs"]])
        raw = trace.logprobs(kind="raw")
        assert [item["logprob"] for item in raw["content"]] == pytest.approx(
            [item["logprob"] for item in logprobs(out, kind="raw")[row]["content"]])
    assert "logprobs" in hfbridge.__all__
