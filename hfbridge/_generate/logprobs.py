"""`logprobs`: each generated token's log-probability and its best alternatives, in OpenAI's chat format.

The format is what the ecosystem reads (OpenAI's `choices[i].logprobs`): per row
`{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}, ...]}`.
`kind="processed"` reads the distribution each token was drawn from (`log_softmax` of the step's
scores after the logits processors: `output_scores=True`); `kind="raw"` reads the model's own
(`log_softmax` of its logits: `output_logits=True`). Rows, steps and beams are read as
`explain_generation` reads them (`output.py`): a beam row follows its `beam_indices`, and the filler
of a finished row (after its eos, or a trailing run of the pad token; for beams where
`beam_indices` is -1) is left out.

>>> import torch
>>> from transformers.generation.utils import GenerateDecoderOnlyOutput
>>> scores = (torch.tensor([[0.0, 0.0, float("-inf")]]),)          # one step, vocabulary of 3
>>> out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[2, 1]]), scores=scores)
>>> entry = logprobs(out, top_logprobs=2)[0]["content"][0]
>>> entry["token"], round(entry["logprob"], 4), entry["bytes"], [a["token"] for a in entry["top_logprobs"]]
('1', -0.6931, [49], ['0', '1'])
"""

from __future__ import annotations

from typing import Any

import torch

from hfbridge._generate.output import padding_flags, read_output, score_rows, stacked_rows, token_ids
from hfbridge._step.plan.padded_vocab import check_drawn_ids
from hfbridge._step.plan.token_text import token_text

__all__ = ["logprobs", "token_entry"]

_KINDS = ("processed", "raw")


def logprobs(output: Any, tokenizer: Any = None, *, top_logprobs: int = 0, kind: str = "processed",
             eos_token_id: int | list[int] | None = None, pad_token_id: int | None = None) -> list[dict[str, Any]]:
    """Per row of `output.sequences`, OpenAI's chat `logprobs` object for its generated tokens.

    Args:
        output: What `generate(..., return_dict_in_generate=True, output_scores=True)` returned
            (hfbridge's or HF's `model.generate`, beam search included); `output_logits=True` for
            `kind="raw"`.
        tokenizer: A HF tokenizer: `token` is `tokenizer.decode([id])`. Default: None, the id as text.
        top_logprobs: How many alternatives per token, the most likely first (0 to the vocabulary
            size; tokens the processors removed are never alternatives). Default: 0.
        kind: `"processed"` (the distribution the token was drawn from) or `"raw"` (the model's).
        eos_token_id: The end-of-sequence token(s), for leaving out a finished row's filler.
            Default: the tokenizer's.
        pad_token_id: The filler of rows finished without eos (stop strings). Default: the tokenizer's.

    Returns:
        A list with one `{"content": [...]}` per row; each entry has `token` (str), `logprob`
        (float, natural log; `-inf` for a token its distribution had removed), `bytes` (the token's
        own bytes, a list of ints: the UTF-8 of `token`, or for a token that holds part of a character
        the bytes it adds, so that consecutive tokens' bytes rebuild the text, as OpenAI's do) and
        `top_logprobs` (a list of `{"token", "logprob", "bytes"}`).

    Raises:
        ValueError: the output lacks `scores` (pass `output_scores=True`) or `logits` (pass
            `output_logits=True`) for `kind`, or an argument is out of range.
    """
    if kind not in _KINDS:
        raise ValueError(f"`kind` must be 'processed' (the scores each token was drawn from) or 'raw' (the model's "
                         f"logits), got {kind!r}.")
    sequences, scores, logits, beam_indices = read_output(output, caller="logprobs",
                                                          need="logits" if kind == "raw" else "scores")
    per_step = scores if kind == "processed" else logits
    assert per_step is not None  # `read_output` raised otherwise
    vocab = per_step[0].shape[1] if per_step else 0
    if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or not 0 <= top_logprobs <= vocab:
        raise ValueError(f"`top_logprobs` must be an int in [0, {vocab}] (alternatives per token), "
                         f"got {top_logprobs!r}.")
    eos = token_ids("eos_token_id", eos_token_id, tokenizer)
    pad = token_ids("pad_token_id", pad_token_id, tokenizer)
    if len(pad) > 1:
        raise TypeError(f"`pad_token_id` must be one int, got {pad_token_id!r}.")
    texts: dict[int, tuple[str, list[int]]] = {}  # id -> (token, bytes), decoded once
    result = []
    for row in range(sequences.shape[0]):
        sources, padding = score_rows(sequences, per_step, beam_indices, row)
        tokens = sequences[row, sequences.shape[1] - len(sources):].tolist()
        if beam_indices is None:
            padding = padding_flags(tokens, eos, next(iter(pad), None))
        kept = [t for t, filler in enumerate(padding) if not filler]
        check_drawn_ids([tokens[t] for t in kept], columns=vocab, tokenizer=tokenizer, caller="logprobs")
        rows = stacked_rows(per_step, [sources[t] for t in kept], "scores" if kind == "processed" else "logits")
        result.append({"content": _content(rows, [tokens[t] for t in kept], top_logprobs, tokenizer, texts)})
    return result


def _content(rows: torch.Tensor, tokens: list[int], top: int, tokenizer: Any,
             texts: dict[int, tuple[str, list[int]]]) -> list[dict[str, Any]]:
    """The entries of one row: `rows` `[S, V]` float32 scores, `tokens` the S chosen ids."""
    if not tokens:
        return []
    if max(tokens) >= rows.shape[1]:
        raise ValueError(f"output.sequences hold token id {max(tokens)}, but the scores have {rows.shape[1]} columns; "
                         "pass the output of one generate call.")
    logp = torch.log_softmax(rows, dim=-1)  # [S, V]
    chosen = logp.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()  # [S]
    best_values, best_ids = torch.topk(logp, top, dim=-1) if top else (None, None)  # [S, k], descending
    content = []
    for t, token in enumerate(tokens):
        alternatives = []
        if best_values is not None and best_ids is not None:
            for value, alternative in zip(best_values[t].tolist(), best_ids[t].tolist()):
                if value > float("-inf"):  # a removed token is not an alternative
                    alternatives.append(token_entry(alternative, value, tokenizer, texts))
        entry = token_entry(token, chosen[t], tokenizer, texts)
        entry["top_logprobs"] = alternatives
        content.append(entry)
    return content


def token_entry(token: int, logprob: float, tokenizer: Any = None,
                texts: dict[int, tuple[str, list[int]]] | None = None) -> dict[str, Any]:
    """`{"token", "logprob", "bytes"}` for one id: the tokenizer's text of it (the id without one), its UTF-8.

    >>> token_entry(7, -0.5)
    {'token': '7', 'logprob': -0.5, 'bytes': [55]}
    """
    known = None if texts is None else texts.get(token)
    if known is None:
        text, own = token_text(tokenizer, token)  # the token's own bytes, even for part of a character
        known = (text, list(own))
        if texts is not None:
            texts[token] = known
    return {"token": known[0], "logprob": float(logprob), "bytes": list(known[1])}
