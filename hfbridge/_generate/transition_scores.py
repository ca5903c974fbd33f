"""`compute_transition_scores`: the score of each generated token, as HF's model method computes it.

HF's `GenerationMixin.compute_transition_scores` reads nothing of the model but the vocabulary
size (`config.vocab_size`), so it runs unchanged on a `ProcessorHost` whose config carries the
vocabulary width of `scores`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PretrainedConfig

from hfbridge._hf.stand_in import ProcessorHost


def compute_transition_scores(
    sequences: torch.Tensor,
    scores: tuple[torch.Tensor, ...] | list[torch.Tensor],
    beam_indices: torch.Tensor | None = None,
    normalize_logits: bool = False,
) -> torch.Tensor:
    """The score of every generated token: HF's `model.compute_transition_scores`, for any model.

    Args:
        sequences: `(rows, prompt + new)` token ids, the `sequences` of `generate`'s output.
        scores: One `(rows_per_step, vocab)` tensor per generated token: the output's `scores`
            (processed) or `logits` (raw), from `generate(..., return_dict_in_generate=True,
            output_scores=True)`. For beam search each step has `prompts * num_beams` rows.
        beam_indices: `(rows, new)` beam index of each token, the output's `beam_indices` after
            beam search (-1 where a beam had finished). Default: None (greedy or sampling).
        normalize_logits: Apply `log_softmax` over the vocabulary to each step first (use it
            with raw `logits`). Default: False.

    Returns:
        `(rows, new)` float scores of the chosen tokens (0 after a beam finished). With
        `normalize_logits=True`, or for beam search (whose scores are log-probabilities), these
        are log-probabilities.

    >>> import torch
    >>> from hfbridge import compute_transition_scores, generate
    >>> table = torch.randn(8, 8)
    >>> out = generate(lambda ids: table[ids], torch.tensor([[1]]), max_new_tokens=3,
    ...                return_dict_in_generate=True, output_scores=True)
    >>> compute_transition_scores(out.sequences, out.scores, normalize_logits=True).shape
    torch.Size([1, 3])
    """
    _check(sequences, scores, beam_indices, normalize_logits)
    config = PretrainedConfig()
    config.vocab_size = scores[0].shape[-1]  # all that HF's method reads of the model
    host: Any = ProcessorHost()  # Any: HF types `self` as a PreTrainedModel
    host.config = config
    return host.compute_transition_scores(sequences, tuple(scores), beam_indices=beam_indices,
                                          normalize_logits=normalize_logits)


def _check(sequences: Any, scores: Any, beam_indices: Any, normalize_logits: Any) -> None:
    if not isinstance(sequences, torch.Tensor) or sequences.ndim != 2 or sequences.is_floating_point():
        raise TypeError(
            "`sequences` must be a (rows, length) tensor of token ids (generate's `sequences`), got "
            f"{_describe(sequences)}."
        )
    if not isinstance(scores, (tuple, list)) or not scores:
        raise TypeError(
            "`scores` must be a non-empty tuple of (rows, vocab) tensors, one per generated token (generate's "
            f"`scores` with return_dict_in_generate=True, output_scores=True), got {_describe(scores)}."
        )
    first = scores[0]
    for step, item in enumerate(scores):
        if not isinstance(item, torch.Tensor) or item.ndim != 2 or not item.is_floating_point():
            raise TypeError(f"`scores[{step}]` must be a (rows, vocab) float tensor, got {_describe(item)}.")
        if item.shape != first.shape:
            raise ValueError(
                f"`scores[{step}]` has shape {tuple(item.shape)} but `scores[0]` has {tuple(first.shape)}; every "
                "step must have the same rows and vocabulary."
            )
    new = len(scores)
    if sequences.shape[1] < new:
        raise ValueError(
            f"`sequences` have {sequences.shape[1]} tokens, fewer than the {new} steps in `scores`; pass the "
            "sequences and scores of the same generate() output."
        )
    if not isinstance(normalize_logits, bool):
        raise TypeError(f"`normalize_logits` must be a bool, got {type(normalize_logits).__name__}.")
    if beam_indices is None:
        if sequences.shape[0] != first.shape[0]:
            raise ValueError(
                f"`sequences` have {sequences.shape[0]} rows but each step of `scores` has {first.shape[0]}; "
                "after beam search pass `beam_indices` too (generate's output.beam_indices)."
            )
        _check_tokens(sequences[:, sequences.shape[1] - new:], first.shape[1])
        return
    if not isinstance(beam_indices, torch.Tensor) or beam_indices.ndim != 2 or beam_indices.is_floating_point():
        raise TypeError(
            f"`beam_indices` must be a (rows, new tokens) integer tensor (generate's output.beam_indices), got "
            f"{_describe(beam_indices)}."
        )
    if beam_indices.shape[0] != sequences.shape[0]:
        raise ValueError(
            f"`beam_indices` have {beam_indices.shape[0]} rows but `sequences` have {sequences.shape[0]}; pass the "
            "beam_indices and sequences of the same generate() output."
        )
    if beam_indices.numel() and int(beam_indices.max()) >= first.shape[0]:
        raise ValueError(
            f"`beam_indices` hold beam {int(beam_indices.max())}, but each step of `scores` has only "
            f"{first.shape[0]} rows."
        )
    # HF keeps the columns up to the longest beam (the rest is -1 padding) and reads that many steps
    used = beam_indices >= 0  # [rows, new]
    longest = int(used.sum(dim=1).max()) if used.numel() else 0
    if longest > new:
        raise ValueError(
            f"`beam_indices` follow beams for {longest} tokens, but `scores` has {new} steps; pass the "
            "beam_indices and scores of the same generate() output."
        )
    if longest > sequences.shape[1]:
        raise ValueError(f"`beam_indices` follow beams for {longest} tokens, but `sequences` have only "
                         f"{sequences.shape[1]}.")
    tokens = sequences[:, sequences.shape[1] - longest:]  # [rows, longest]
    _check_tokens(tokens, first.shape[1], where=used[:, :longest])


def _check_tokens(tokens: torch.Tensor, vocab: int, where: torch.Tensor | None = None) -> None:
    """Every scored token id within the vocabulary of `scores`.

    HF's method reads the score at `row * vocab + token` of the flattened step: an id past the
    vocabulary would silently return another row's score for another token.
    """
    outside = (tokens < 0) | (tokens >= vocab)  # [rows, new]
    if where is not None:
        outside &= where  # finished beams (-1) are not scored
    if bool(outside.any()):
        row, column = (int(i) for i in outside.nonzero()[0])
        raise ValueError(
            f"`sequences` row {row} holds token id {int(tokens[row, column])} at generated position {column}, "
            f"outside the {vocab} vocabulary columns of `scores`; pass the sequences and scores of the same "
            "generate() output (a pad_token_id outside the vocabulary cannot be scored either)."
        )


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__
