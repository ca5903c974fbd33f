"""A whole generation token by token: `explain_generation` and the `GenerationTrace` it returns.

The trace is read from what `generate(..., return_dict_in_generate=True, output_scores=True)`
returns (hfbridge's or HF's own `model.generate`; the output classes are the same): the scores
after the logits processors at every step, and with ``output_logits=True`` the model's raw logits.
A token's probability is the softmax of its step's processed scores, which is ``exp`` of HF's
``compute_transition_scores(..., normalize_logits=True)`` for the same output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hfbridge._generate.output import padding_flags as _padding_flags
from hfbridge._generate.output import read_output, score_rows, stacked_rows
from hfbridge._generate.output import token_ids as _token_ids
from hfbridge._step.checks.option_checks import check_tokenizer
from hfbridge._step.plan.padded_vocab import check_drawn_ids
from hfbridge._step.plan.phase_options import thinking_steps
from hfbridge._views import trace_html as _trace_html
from hfbridge._views import trace_view as _trace_view
from hfbridge._views.generation_record import Alternative, GenerationRecord, TokenStep

__all__ = ["Alternative", "GenerationTrace", "TokenStep", "explain_generation"]

_DECODE_CONTEXT = 8  # tokens decoded before a token, so its text is read as it appears in the sequence


class GenerationTrace(GenerationRecord):
    """The record `explain_generation` returns: HTML in Jupyter, text with ``print``, ``.plot()``.

    Attributes:
        steps: One `TokenStep` per generated position, padding included (marked).
        prompt_ids: The row's tokens before the first generated one (left padding included).
        row: The row of ``output.sequences`` that is traced.
        rows: How many rows the output has.
        beams: Whether the output came from beam search (``beam_indices`` present).
        has_model: Whether the model's own distribution (``output.logits``) was available.
        tokenizer: Used to show tokens as text. Default: ``None`` (ids are shown).
    """

    def __str__(self) -> str:
        return _trace_view.text_table(self)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return _trace_html.html_fragment(self)

    def html(self, *, table: str = "uncertain") -> str:
        """The HTML fragment Jupyter shows, with the table of your choice.

        Args:
            table: ``"uncertain"``: the steps whose token had p < 0.5 or was not the most likely
                (at most 100, the least likely); ``"all"``: every step; ``"none"``: no table.
                Default: ``"uncertain"``.
        """
        return _trace_html.html_fragment(self, table)

    def to_html(self, *, table: str = "uncertain") -> str:
        """A standalone HTML page (its own stylesheet): the same look as in Jupyter, anywhere (``table``: see `html`).

        >>> import torch
        >>> from transformers.generation.utils import GenerateDecoderOnlyOutput
        >>> out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[0, 2]]), scores=(torch.zeros(1, 3),))
        >>> explain_generation(out).to_html().startswith("<!DOCTYPE html>")
        True
        """
        return _trace_html.html_page(self, table)

    def plot(self, *, ax: Any = None) -> Any:
        """The chosen token's probability (top) and the entropy (bottom) at every step.

        With the model's own distribution available, its values are drawn beside the processed
        ones. Padding steps are shaded. From 300 steps on, bars would be a wall: each step is a
        faint dot, a rolling mean a line, and tokens with p < 0.1 are marked.

        Args:
            ax: Two matplotlib ``Axes`` (probability, entropy) to draw into. Default: a new figure.

        Returns:
            The matplotlib ``Figure`` (a new figure is closed in pyplot, so Jupyter shows it once).
        """
        return _trace_view.plot(self, axes=ax)


def explain_generation(
    output: Any,
    tokenizer: Any = None,
    *,
    row: int = 0,
    top: int = 5,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    thinking_start: Any = None,
    thinking_end: Any = None,
) -> GenerationTrace:
    """Trace one row of a generation token by token: how likely each token was, what else was.

    Args:
        output: What ``generate(..., return_dict_in_generate=True, output_scores=True)`` returned
            (hfbridge's `generate` or HF's ``model.generate``; beam search outputs too). With
            ``output_logits=True`` as well, the model's own probabilities are shown beside the
            processed ones.
        tokenizer: A HF tokenizer to show tokens as text. Default: ``None`` (token ids are shown).
        row: Which row of ``output.sequences`` to trace. Default: ``0``.
        top: How many alternatives to keep per step. Default: ``5``.
        eos_token_id: The end-of-sequence token(s): the filler after a row's first eos (one
            repeated token, as ``generate`` pads finished rows) is marked as padding. Default:
            the tokenizer's ``eos_token_id``.
        pad_token_id: The filler of rows finished without eos (stop strings): a run of it at the
            end of the row is marked as padding. Default: the tokenizer's ``pad_token_id``.
        thinking_start: With ``thinking_end``: the thinking tags (strings with ``tokenizer``, or token ids), to
            mark each step's phase (``TokenStep.thinking``, "(thinking)" in the text), as ``thinking_options``
            chose it. Default: ``None`` (no phases).
        thinking_end: See ``thinking_start``.

    Returns:
        A `GenerationTrace`.

    Raises:
        TypeError: ``output`` is not a generate output (for example the bare sequences tensor).
        ValueError: the output has no scores, ``row``/``top`` are out of range, or the scores do
            not fit the sequences.

    >>> import torch
    >>> from transformers.generation.utils import GenerateDecoderOnlyOutput
    >>> scores = (torch.tensor([[0.0, 2.0, float("-inf")]]),)     # one step, vocabulary of 3
    >>> out = GenerateDecoderOnlyOutput(sequences=torch.tensor([[0, 1]]), scores=scores)
    >>> step = explain_generation(out).steps[0]
    >>> step.token, round(step.prob, 4), step.possible
    (1, 0.8808, 2)
    """
    check_tokenizer(tokenizer)
    sequences, scores, logits, beam_indices = read_output(output)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top: expected a positive int (alternatives per step), got {top!r}")
    if isinstance(row, bool) or not isinstance(row, int):
        raise TypeError(f"row: expected an int (which row of output.sequences), got {type(row).__name__}")
    n_rows = sequences.shape[0]
    if not 0 <= row < n_rows:
        raise ValueError(f"row: got {row}, expected 0 <= row < {n_rows} (output.sequences has {n_rows} rows)")

    sources, padding = score_rows(sequences, scores, beam_indices, row)
    length = len(sources)
    cut = sequences.shape[1] - length
    ids = sequences[row].tolist()
    tokens = ids[cut:]
    if beam_indices is None:
        pad = _token_ids("pad_token_id", pad_token_id, tokenizer)
        if len(pad) > 1:
            raise TypeError(f"pad_token_id: expected one int, got {pad_token_id!r}")
        padding = _padding_flags(tokens, _token_ids("eos_token_id", eos_token_id, tokenizer), next(iter(pad), None))

    processed = stacked_rows(scores, sources, "scores")  # [S, V]
    vocab = processed.shape[1]
    if tokens and max(tokens) >= vocab:
        raise ValueError(
            f"output.sequences row {row} holds token id {max(tokens)}, but the scores have {vocab} vocabulary "
            "columns; pass the output of the same generate call."
        )
    check_drawn_ids([t for t, filler in zip(tokens, padding) if not filler], columns=vocab, tokenizer=tokenizer,
                    caller="explain_generation")
    model = None
    if logits is not None:
        model = stacked_rows(logits, sources, "logits")
        if model.shape != processed.shape:
            raise ValueError(
                f"output.logits and output.scores differ in shape ({tuple(model.shape[1:])} vs "
                f"{tuple(processed.shape[1:])} per step); pass the output of one generate call."
            )

    chosen = torch.tensor(tokens, dtype=torch.long)[:, None]  # [S, 1]
    stats = _distribution(processed, chosen, top)
    model_stats = _distribution(model, chosen, top) if model is not None else None
    texts = _step_texts(tokenizer, ids, cut, padding)
    thinking: list[bool | None] = [None] * length
    if thinking_start is not None or thinking_end is not None:
        if thinking_start is None or thinking_end is None:
            raise ValueError("explain_generation(): pass both `thinking_start` and `thinking_end` (the tags that "
                             "open and close a thinking span), or neither.")
        thinking = list(thinking_steps(ids, thinking_start, thinking_end, cut, tokenizer))
    steps = []
    for t in range(length):
        alternatives = [
            Alternative(
                token=token_id,
                text=None if tokenizer is None else tokenizer.decode([token_id]),
                prob=prob,
                model_prob=None if model_stats is None else float(model_stats.probs[t, token_id]),
            )
            for token_id, prob in zip(stats.top_ids[t], stats.top_probs[t])
        ]
        steps.append(TokenStep(
            step=t,
            token=tokens[t],
            text=texts[t],
            prob=float(stats.chosen_logprob[t].exp()),
            logprob=float(stats.chosen_logprob[t]),
            rank=int(stats.rank[t]),
            alternatives=alternatives,
            possible=int(stats.possible[t]),
            entropy=float(stats.entropy[t]),
            model_prob=None if model_stats is None else float(model_stats.chosen_logprob[t].exp()),
            model_entropy=None if model_stats is None else float(model_stats.entropy[t]),
            padding=padding[t],
            beam=sources[t] if beam_indices is not None and not padding[t] else None,
            thinking=thinking[t],
        ))
    return GenerationTrace(steps=steps, prompt_ids=ids[:cut], row=row, rows=n_rows, beams=beam_indices is not None,
                           has_model=model is not None, tokenizer=tokenizer)


@dataclass
class _Stats:
    chosen_logprob: torch.Tensor  # [S]
    rank: torch.Tensor  # [S]
    possible: torch.Tensor  # [S]
    entropy: torch.Tensor  # [S]
    probs: torch.Tensor  # [S, V]
    top_ids: list[list[int]]
    top_probs: list[list[float]]


def _distribution(scores: torch.Tensor, chosen: torch.Tensor, top: int) -> _Stats:
    """Per step: the chosen token's log-probability and rank, the tokens left, entropy, the top tokens."""
    logprobs = torch.log_softmax(scores, dim=-1)  # [S, V]
    probs = logprobs.exp()
    chosen_score = scores.gather(1, chosen)  # [S, 1]
    possible = (scores > float("-inf")).sum(dim=1)  # [S]
    top_probs, top_ids = torch.topk(probs, min(top, scores.shape[1]), dim=-1)  # [S, k]
    keep = top_probs > 0  # removed tokens are not alternatives (`possible` counts what is left)
    return _Stats(
        chosen_logprob=logprobs.gather(1, chosen)[:, 0],
        rank=(scores > chosen_score).sum(dim=1) + 1,
        possible=possible,
        entropy=torch.special.entr(probs).sum(dim=1),
        probs=probs,
        top_ids=[ids[k].tolist() for ids, k in zip(top_ids, keep)],
        top_probs=[p[k].tolist() for p, k in zip(top_probs, keep)],
    )




def _step_texts(tokenizer: Any, ids: list[int], cut: int, padding: list[bool]) -> list[str | None]:
    """Each generated token's text as it reads in the sequence.

    Decoding a token alone loses what depends on its neighbours (a leading space a
    SentencePiece tokenizer drops at the start, bytes of a character split over two tokens), so
    a token's text is the growth of the decoded text when it is added to a few tokens before it.
    """
    if tokenizer is None:
        return [None] * (len(ids) - cut)
    texts: list[str | None] = []
    for position in range(cut, len(ids)):
        if padding[position - cut]:
            texts.append(tokenizer.decode([ids[position]]))
            continue
        start = max(0, position - _DECODE_CONTEXT)
        before = tokenizer.decode(ids[start:position])
        after = tokenizer.decode(ids[start:position + 1])
        # A character completed by this token replaces the previous text's last "\ufffd": keep what differs.
        same = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
        texts.append(after[same:])
    return texts
