"""Local tokenizers of every decoder kind, built with `tokenizers` (nothing downloaded), for banned strings' text.

Each is a `PreTrainedTokenizerFast` whose vocabulary mixes whole words, pieces with and without a leading space,
multi-byte characters (CJK, emoji) as whole tokens and as bytes split over several tokens, punctuation, and
added tokens (special and not): what makes `decode(a + b)` differ from `decode(a) + decode(b)`.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = [
    "The cat sat on the mat. It didn't move, and the dog's bark wasn't loud!",
    "Shivers ran down her spine; she'd delve into the tapestry of time?",
    "猫が座った。犬は吠えない。東京は大きい街です。",
    "Emoji: 😀 😃 🙏 🎉 👍🏽 and flags 🇫🇷, accents: café, naïve, Zürich, ½ €5.",
    "def f(x):\n    return x * 2  # code, too\n",
]

SPECIALS = ["<eos>", "<pad>"]


def byte_level(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """GPT-2-like: byte-level BPE trained on `CORPUS` (merges), its decoder, an added special and a plain added token."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(CORPUS * 3, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")
    tok.add_tokens([AddedToken("<tool>", special=False), AddedToken("<|im_end|>", special=True)])
    return tok


def _pieces() -> list[str]:
    words = ["▁the", "▁cat", "▁sat", "▁on", "▁mat", "▁dog", "▁del", "ve", "▁tap", "est", "ry", "▁Sh", "iver", "s",
             "▁", "a", "b", "c", "e", "t", "▁a", "▁b", "n't", "'s", "'", ".", ",", "!", "?", "▁.", "▁,", "▁!",
             "猫", "が", "東京", "は", "😀", "🎉", "▁😀", "é", "caf", "\n", "▁▁"]
    return words


def metaspace() -> PreTrainedTokenizerFast:
    """SentencePiece-like: pieces with `▁`, the Metaspace decoder (drops the first token's leading space)."""
    vocab = {token: index for index, token in enumerate(SPECIALS + _pieces())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")


def llama_like() -> PreTrainedTokenizerFast:
    """Llama-2-like: `▁` pieces, 256 byte-fallback tokens `<0x..>` (characters outside the vocabulary, split over
    several tokens and decoded as one run), the decoder sequence Replace, ByteFallback, Fuse, Strip."""
    tokens = SPECIALS + [f"<0x{byte:02X}>" for byte in range(256)] + _pieces()
    backend = Tokenizer(models.BPE(vocab={token: index for index, token in enumerate(tokens)}, merges=[],
                                   byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")


def word_piece() -> PreTrainedTokenizerFast:
    """BERT-like: `##` continuations and the WordPiece decoder's clean-up ("do n't" -> "don't", " ." -> ".")."""
    pieces = ["the", "cat", "do", "n't", "##s", "##ing", ".", ",", "'", "s", "!", "?", "猫", "##猫", "😀", "a", "##a",
              "[UNK]"]
    backend = Tokenizer(models.WordPiece({token: index for index, token in enumerate(SPECIALS + pieces)},
                                         unk_token="[UNK]"))
    backend.decoder = decoders.WordPiece(cleanup=True)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")


def cleaned_up() -> PreTrainedTokenizerFast:
    """Pieces fused without spaces, with transformers' `clean_up_tokenization_spaces=True` on the whole text."""
    pieces = ["a", "b", " ", " .", ".", " ,", "n't", " n't", "'s", " 's", "'", " '", "?", " ?", "x", "é", "😀"]
    backend = Tokenizer(models.WordLevel({token: index for index, token in enumerate(SPECIALS + pieces)},
                                         unk_token="x"))  # transformers 5 cleans up no BPE tokenizer
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>",
                                   clean_up_tokenization_spaces=True)


def word_level() -> PreTrainedTokenizerFast:
    """No decoder at all: `tokenizers` joins the tokens with spaces."""
    words = ["a", "b", "cat", "sat", "猫", "😀", ".", "x"]
    backend = Tokenizer(models.WordLevel({token: index for index, token in enumerate(SPECIALS + words)},
                                         unk_token="x"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")


def ctc() -> PreTrainedTokenizerFast:
    """The CTC decoder: repeated tokens collapse, `<pad>` is dropped, `|` is a space."""
    words = ["a", "b", "c", "|", "猫", "😀", "."]
    backend = Tokenizer(models.WordLevel({token: index for index, token in enumerate(SPECIALS + words)},
                                         unk_token="a"))
    backend.decoder = decoders.CTC(pad_token="<pad>", word_delimiter_token="|")
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")


KINDS = {"byte_level": byte_level, "metaspace": metaspace, "llama_like": llama_like, "word_piece": word_piece,
         "cleaned_up": cleaned_up, "word_level": word_level, "ctc": ctc}
