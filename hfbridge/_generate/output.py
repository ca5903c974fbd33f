"""Reading the output of `generate(..., return_dict_in_generate=True, output_scores=True)`, checked.

`explain_generation` takes the output of hfbridge's `generate` or of HF's `model.generate`:
`read_output` finds its `sequences`, `scores`, `logits` and `beam_indices` (attributes or dict keys)
with errors that say which one is missing or malformed; `score_rows` maps each generated position
to the row of the scores it came from (beams included, as HF's `compute_transition_scores` does);
`stacked_rows` gathers those rows into one float32 CPU tensor.

>>> import torch
>>> out = {"sequences": torch.tensor([[1, 2, 3]]), "scores": (torch.zeros(1, 4), torch.zeros(1, 4))}
>>> sequences, scores, logits, beams = read_output(out)
>>> score_rows(sequences, scores, beams, 0)
([0, 0], [False, False])
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["padding_flags", "read_output", "score_rows", "stacked_rows", "token_ids"]


def read_output(output: Any, *, caller: str = "explain_generation", need: str = "scores"
                ) -> tuple[torch.Tensor, tuple, tuple | None, torch.Tensor | None]:
    """``sequences``, ``scores``, ``logits`` and ``beam_indices`` of a generate output, checked.

    `need="logits"`: the raw logits are required (``output_logits=True``) and the scores may be absent
    (then the logits stand in for them in the result).
    """
    if isinstance(output, torch.Tensor):
        raise TypeError(
            f"{caller} needs the output of generate(..., return_dict_in_generate=True, output_scores=True); "
            f"got a tensor of shape {tuple(output.shape)} (the sequences alone, without the scores)."
        )

    def read(name: str) -> Any:
        if hasattr(output, name):  # HF's output classes (attributes win over their dict view)
            return getattr(output, name)
        return output.get(name) if isinstance(output, dict) else None

    sequences = read("sequences")
    if not isinstance(sequences, torch.Tensor):
        raise TypeError(
            f"{caller} needs the output of generate(..., return_dict_in_generate=True, output_scores=True), "
            f"got {type(output).__name__} without a `sequences` tensor."
        )
    if sequences.ndim != 2 or sequences.is_floating_point():
        raise ValueError(f"output.sequences: expected (batch, seq) token ids, got shape {tuple(sequences.shape)} "
                         f"of {sequences.dtype}.")
    scores = read("scores")
    if need == "logits":
        if read("logits") is None:
            raise ValueError(
                "output.logits is None: pass output_logits=True to generate (with return_dict_in_generate=True) so the "
                "model's raw logits of every step are kept."
            )
        if scores is None:
            scores = read("logits")
    if scores is None:
        raise ValueError(
            "output.scores is None: pass output_scores=True to generate (with return_dict_in_generate=True) so the "
            "processed distribution of every step is kept" + (" (output.logits holds the model's raw logits only)."
                                                               if read("logits") is not None else ".")
        )
    logits = read("logits")
    for name, value in (("scores", scores), ("logits", logits)):
        if value is None:
            continue
        if not isinstance(value, (tuple, list)) or not all(isinstance(s, torch.Tensor) and s.ndim == 2 for s in value):
            raise TypeError(f"output.{name}: expected a tuple of (rows, vocab) tensors, one per step.")
    if logits is not None and len(logits) != len(scores):
        raise ValueError(f"output.logits has {len(logits)} steps but output.scores has {len(scores)}; pass the output "
                         "of one generate call.")
    beam_indices = read("beam_indices")
    return sequences, tuple(scores), None if logits is None else tuple(logits), beam_indices


def score_rows(sequences: torch.Tensor, scores: tuple, beam_indices: torch.Tensor | None,
                row: int) -> tuple[list[int], list[bool]]:
    """For each generated position of ``row``: which row of that step's scores it came from, and padding.

    Mirrors HF's `compute_transition_scores`: without beams a row reads its own row of the scores;
    with beams, ``beam_indices`` says which, ``-1`` marks the filler after a beam finished, and
    the generated length is the longest beam's.
    """
    steps = len(scores)
    if beam_indices is None:
        if steps and scores[0].shape[0] != sequences.shape[0]:
            raise ValueError(
                f"output.scores have {scores[0].shape[0]} rows per step but output.sequences has "
                f"{sequences.shape[0]}; a beam search output needs its beam_indices (output_scores=True keeps them)."
            )
        if steps > sequences.shape[1]:
            raise ValueError(f"output.scores has {steps} steps but output.sequences only {sequences.shape[1]} columns.")
        return [row] * steps, [False] * steps
    if beam_indices.shape[0] != sequences.shape[0]:
        raise ValueError(f"output.beam_indices has {beam_indices.shape[0]} rows but output.sequences has "
                         f"{sequences.shape[0]}.")
    length = int((beam_indices >= 0).sum(dim=-1).max()) if beam_indices.numel() else 0
    if length > min(steps, sequences.shape[1]):
        raise ValueError(f"output.beam_indices covers {length} steps but output.scores has {steps}.")
    sources = beam_indices[row, :length].tolist()
    return [max(s, 0) for s in sources], [s < 0 for s in sources]


def stacked_rows(per_step: tuple, sources: list[int], name: str) -> torch.Tensor:
    """The traced row of every step as one float32 CPU tensor ``[S, V]`` (one transfer)."""
    if not sources:
        width = per_step[0].shape[1] if per_step else 0
        return torch.zeros(0, width)
    widths = {s.shape[1] for s in per_step[: len(sources)]}
    if len(widths) > 1:
        raise ValueError(f"output.{name}: the vocabulary width changes between steps ({sorted(widths)}).")
    rows = torch.stack([per_step[t][source] for t, source in enumerate(sources)])  # [S, V]
    rows = rows.to(device="cpu", dtype=torch.float32)
    bad = torch.isnan(rows).any(dim=1) | (rows == float("inf")).any(dim=1)  # [S]
    if bool(bad.any()):
        step = int(bad.nonzero()[0, 0])
        raise ValueError(f"output.{name} at step {step} holds NaN or +inf; no distribution can be read from it.")
    return rows


def token_ids(name: str, value: Any, tokenizer: Any) -> set[int]:
    """``eos_token_id`` / ``pad_token_id`` as a set of ids, from the argument or else the tokenizer."""
    given = value
    if value is None:
        value = getattr(tokenizer, name, None)
    if value is None:
        return set()
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    values = value if isinstance(value, (list, tuple, set)) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TypeError(f"{name}: expected an int or a list of ints, got {given!r}")
    return set(values)


def padding_flags(tokens: list[int], eos: set[int], pad: int | None) -> list[bool]:
    """Which positions are the filler `generate` puts in a finished row while other rows go on.

    After the row's first eos, the filler is one repeated token; varied tokens after an eos mean
    that it did not stop the row (it was no stopping criterion), so they were generated. The eos
    itself was generated, also when it is the row's last token and when the pad token is the eos
    (GPT-2's usual setup). A row stopped another way (a stop string, a custom criterion) ends in a
    run of the pad token; when that token is an eos, the run's first one is read as the eos that
    ended the row. The first token is always generated.
    """
    first = next((t for t, token in enumerate(tokens) if token in eos), None)
    if first is not None and len(set(tokens[first + 1:])) <= 1:
        return [t > first for t in range(len(tokens))]
    run = 0
    while pad is not None and run < len(tokens) - 1 and tokens[-1 - run] == pad:
        run += 1
    if run and pad in eos:
        run -= 1  # the first of the run is the eos that finished the row
    return [t >= len(tokens) - run for t in range(len(tokens))]
