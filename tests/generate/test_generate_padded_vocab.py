"""`generate` on a padded vocabulary without `vocab_size=`: the tokenizer's size, the model's IndexError,
an HF model's own columns, and `logprobs` / `explain_generation` on a generation that drew padding."""

import warnings

import pytest
import torch

from hfbridge import explain_generation, generate, logprobs

from _tiny_models import char_tokenizer, tiny_gpt2

pytestmark = pytest.mark.usefixtures("one_thread", "quiet_hf")

TOKENS = 45  # char_tokenizer's size
COLUMNS = 64
PROMPT = torch.tensor([[3, 4, 5], [6, 7, 8]])


class Padded(torch.nn.Module):
    """nanoGPT's shape of model: an embedding of `rows` ids, a head of 64 columns whose padding is likely."""

    def __init__(self, rows: int):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Embedding(rows, 16), torch.nn.Linear(16, COLUMNS)
        with torch.no_grad():
            self.head.bias[TOKENS:] = 4.0

    def forward(self, ids):  # [B, T] -> [B, T, 64]
        return self.head(self.embed(ids))


@pytest.mark.parametrize("options", [{}, {"do_sample": True}, {"do_sample": True, "fast": True},
                                     {"num_beams": 2}, {"prompt_lookup_num_tokens": 2}],
                         ids=["greedy", "sampled", "fast", "beams", "prompt-lookup"])
def test_tokenizer_size_is_the_vocabulary(options):
    model = Padded(COLUMNS)  # embeds every column: padding ids would be drawn and shown as ''
    prompt = PROMPT[:1] if "prompt_lookup_num_tokens" in options else PROMPT
    torch.manual_seed(0)
    ours = generate(model, prompt, max_new_tokens=12, tokenizer=char_tokenizer(), **options)
    torch.manual_seed(0)
    explicit = generate(model, prompt, max_new_tokens=12, vocab_size=TOKENS, **options)
    assert torch.equal(ours, explicit) and int(ours[:, 3:].max()) < TOKENS
    torch.manual_seed(0)
    assert int(generate(model, prompt, max_new_tokens=12, **options)[:, 3:].max()) >= TOKENS  # without: padding


def test_model_index_error_names_vocab_size():
    model = Padded(TOKENS)  # embeds only the real tokens, as a port whose head was padded
    with pytest.raises(ValueError, match=r"^generate\(\): at step 1 the model raised IndexError, fed token ids up to "
                                         r"(4[5-9]|5\d|6[0-3]) \(IndexError: index out of range in self\)\. .*"
                                         r"pass vocab_size= \(the number of real tokens\), or tokenizer="):
        generate(model, PROMPT, max_new_tokens=5)
    fine = generate(model, PROMPT, max_new_tokens=5, tokenizer=char_tokenizer())
    assert int(fine[:, 3:].max()) < TOKENS


def test_index_error_on_the_prompt_is_the_models_own():
    with pytest.raises(IndexError, match="index out of range in self") as caught:
        generate(Padded(TOKENS), torch.tensor([[3, 50]]), max_new_tokens=2)  # the caller's id, not a drawn one
    assert "raised at step 0" in "".join(getattr(caught.value, "__notes__", []))


def test_hf_model_keeps_its_columns():
    """A transformers model draws from every column of its logits, as its own `model.generate`."""
    hf = tiny_gpt2()  # 48 columns, a tokenizer of 45: ids 45-47 stay possible, as in HF
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(4)
        theirs = hf.generate(PROMPT, max_new_tokens=30, do_sample=True, temperature=8.0, pad_token_id=0)
    torch.manual_seed(4)
    ours = generate(hf, PROMPT, max_new_tokens=30, do_sample=True, temperature=8.0, pad_token_id=0,
                    tokenizer=char_tokenizer())
    assert torch.equal(ours, theirs) and int(theirs[:, 3:].max()) >= TOKENS


def test_views_refuse_a_drawn_padding_id():
    torch.manual_seed(0)
    out = generate(Padded(COLUMNS), PROMPT, max_new_tokens=6, return_dict_in_generate=True, output_scores=True)
    drawn = int(out.sequences[0, 3:].max())  # both views read row 0 first
    assert drawn >= TOKENS
    for view in (logprobs, explain_generation):
        with pytest.raises(ValueError, match=rf"^{view.__name__}: the generation drew token id {drawn}, but the "
                                             rf"tokenizer knows 45 tokens .* vocab_size=45 \(or tokenizer="):
            view(out, char_tokenizer())
    torch.manual_seed(0)
    clean = generate(Padded(COLUMNS), PROMPT, max_new_tokens=6, return_dict_in_generate=True, output_scores=True,
                     tokenizer=char_tokenizer())
    entries = logprobs(clean, char_tokenizer(), top_logprobs=3)
    assert all(entry["token"] != "" for entry in entries[0]["content"])
    assert explain_generation(clean, char_tokenizer()).steps[0].token < TOKENS


def test_assisted_decoding_drops_both_models_padding():
    target, draft = Padded(COLUMNS), Padded(COLUMNS)
    ours = generate(target, PROMPT[:1], max_new_tokens=12, tokenizer=char_tokenizer(), assistant_model=draft)
    assert torch.equal(ours, generate(target, PROMPT[:1], max_new_tokens=12, vocab_size=TOKENS))
