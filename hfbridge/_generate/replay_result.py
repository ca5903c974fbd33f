"""`Replay`: what `hfbridge.replay` recomputed for every generated token, and what a trainer reads of it.

Per generated token, `(rows, new_tokens)`: `logprobs` (processed: the log-probability of the token in the
distribution it was drawn from, after the whole chain and the temperature), `raw_logprobs` (the model's
own), `kept_mass` (the model's raw probability of the tokens the chain kept) and `generated` (False on the
filler of a row that had finished). Per step, `scores` (as `generate(..., output_scores=True)` returns
them), `kept(step)` (a bool mask) and its compact forms, `kept_ids(step)` and `kept_csr(step)` (the
layout of vLLM's sampling mask: row offsets and column indices).

>>> import torch
>>> scores = (torch.tensor([[0.0, 0.0, float("-inf")]]),)
>>> r = Replay(sequences=torch.tensor([[2, 1]]), prompt_length=1, scores=scores,
...            raw_logprobs=torch.tensor([[-1.0]]), kept_mass=torch.tensor([[0.75]]),
...            generated=torch.tensor([[True]]))
>>> r.logprobs, r.kept(0).tolist(), r.kept_csr(0)
(tensor([[-0.6931]]), [[True, True, False]], (tensor([0, 2]), tensor([0, 1])))
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["Replay"]

_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


class Replay:
    """The replayed distribution of every generated token (see the module; `hfbridge.replay` builds it).

    Attributes:
        sequences: `(rows, prompt + new)` the replayed sequences (the caller's, copied).
        prompt_length: The generated tokens start at this column.
        tokens: `(rows, new)` the generated tokens.
        scores: One `(rows, vocab)` float32 tensor per new token: the processed scores the token was
            chosen from (`generate`'s `output_scores`, bit for bit in the default replay).
        raw_logprobs: `(rows, new)` `log_softmax` of the model's logits at the token.
        kept_mass: `(rows, new)` the model's probability of the tokens the chain kept (scores > -inf).
        generated: `(rows, new)` bool, False where the row had already finished (the pad filler).
    """

    def __init__(self, *, sequences: torch.Tensor, prompt_length: int, scores: tuple[torch.Tensor, ...],
                 raw_logprobs: torch.Tensor, kept_mass: torch.Tensor, generated: torch.Tensor):
        self.sequences = sequences
        self.prompt_length = prompt_length
        self.tokens = sequences[:, prompt_length:]  # [N, S]
        self.scores = scores
        self.raw_logprobs = raw_logprobs
        self.kept_mass = kept_mass
        self.generated = generated
        self._logprobs: torch.Tensor | None = None

    def __repr__(self) -> str:
        rows, steps = self.tokens.shape
        return f"Replay({rows} rows x {steps} tokens)"

    @property
    def logprobs(self) -> torch.Tensor:
        """`(rows, new)` the processed log-probability of each token: `log_softmax(scores[t])` at the token
        (-inf for a token the chain had removed, which only a finished row's filler can be)."""
        if self._logprobs is None:
            rows, steps = self.tokens.shape
            if not steps:
                self._logprobs = torch.zeros((rows, 0), device=self.tokens.device)
            else:
                self._logprobs = torch.stack([torch.log_softmax(scores, dim=-1).gather(1, self.tokens[:, t, None])[:, 0]
                                              for t, scores in enumerate(self.scores)], dim=1)  # [N, S]
        return self._logprobs

    def kept(self, step: int) -> torch.Tensor:
        """`(rows, vocab)` bool: the tokens the chain kept at `step` (their score is above -inf)."""
        return self.scores[self._step(step)] > float("-inf")

    def kept_ids(self, step: int) -> list[torch.Tensor]:
        """The kept token ids at `step`, one ascending 1-D tensor per row."""
        mask = self.kept(step)
        return [row.nonzero()[:, 0] for row in mask]

    def kept_csr(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept tokens at `step` in compressed sparse rows: `(crow_indices [rows + 1], col_indices [kept])`,
        int64; row i's kept ids are `col_indices[crow_indices[i]:crow_indices[i + 1]]`."""
        mask = self.kept(step)  # [N, V]
        counts = mask.sum(dim=1)  # [N]
        crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        return crow, mask.nonzero()[:, 1]

    def importance_ratio(self, trainer_logprobs: Any, *, cap: float | None = None, floor: float | None = None,
                         mode: str = "token_truncate") -> torch.Tensor:
        """`(rows, new)` ratios `exp(trainer_logprobs - logprobs)` between a trainer's log-probabilities of the
        tokens and the replayed (processed) ones: the correction TRL's GRPO applies with
        `vllm_importance_sampling_correction=True` (TRL 1.16, `_generate_and_score_completions`), with the replay
        standing in for the engine's sampling log-probabilities.

        Args:
            trainer_logprobs: `(rows, new)` the trainer's log-probability of each generated token.
            cap: The upper bound (TRL's `vllm_importance_sampling_clip_max`, formerly
                `vllm_importance_sampling_cap`). Default None: no upper bound.
            floor: The lower bound (TRL's `vllm_importance_sampling_clip_min`). Default None: none.
            mode: TRL's `vllm_importance_sampling_mode`: `"token_truncate"` (each ratio clamped to
                `[floor, cap]`), `"token_mask"` (ratios outside it set to 0), `"sequence_truncate"` /
                `"sequence_mask"` (one ratio per row, `exp` of the summed differences over the generated
                tokens, shape `(rows, 1)`, then clamped or masked). Default: `"token_truncate"` (TRL 1.16's
                default is `"sequence_mask"`). Without bounds every mode returns the plain ratios.

        The filler after a row finished (`generated` False) counts 0 in the sums (ratio 1 in the token
        modes), as TRL's completion mask does; its processed log-probability may be -inf.
        """
        trainer = _checked_logprobs(trainer_logprobs, self.tokens.shape, "trainer_logprobs")
        if mode not in _MODES:
            raise ValueError(f"`mode` must be one of {list(_MODES)} (TRL's vllm_importance_sampling_mode), "
                             f"got {mode!r}.")
        for name, bound in (("cap", cap), ("floor", floor)):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))
                                      or not bound >= 0 or math.isinf(bound)):
                raise ValueError(f"`{name}` must be a finite number >= 0 (TRL's vllm_importance_sampling_clip_"
                                 f"{'max' if name == 'cap' else 'min'}) or None, got {bound!r}.")
        if cap is not None and floor is not None and floor > cap:
            raise ValueError(f"`floor` ({floor}) must not exceed `cap` ({cap}).")
        own = self.logprobs.to(trainer.device)
        live = self.generated.to(trainer.device)
        difference = torch.where(live, trainer.to(torch.float32) - own, 0.0)  # [N, S]
        if mode.startswith("sequence"):
            difference = difference.sum(dim=-1, keepdim=True)  # [N, 1]
        ratio = difference.exp()
        if cap is None and floor is None:
            return ratio
        if mode.endswith("truncate"):
            return ratio.clamp(min=floor, max=cap)
        outside = torch.zeros_like(ratio, dtype=torch.bool)
        if cap is not None:
            outside |= ratio > cap
        if floor is not None:
            outside |= ratio < floor
        return ratio.masked_fill(outside, 0.0)

    def check(self, reported_logprobs: Any = None, *, atol: float = 0.0) -> None:
        """Check that the tokens came from the chain replayed: each generated token inside its kept support,
        and, given `reported_logprobs` `(rows, new)` (an engine's processed log-probabilities), each equal to
        the replayed one within `atol` (0: bit for bit). Raises `ValueError` naming the first row and step
        that does not fit; returns None."""
        kept = torch.stack([self.kept(t).gather(1, self.tokens[:, t, None])[:, 0] for t in range(len(self.scores))],
                           dim=1) if self.scores else self.generated  # [N, S]
        outside = self.generated & ~kept
        if bool(outside.any()):
            row, step = (int(i) for i in outside.nonzero()[0])
            raise ValueError(f"row {row}, step {step}: token {int(self.tokens[row, step])} is outside the support the "
                             "chain kept there (its processed score is -inf): it was not drawn from this chain.")
        if reported_logprobs is None:
            return
        reported = _checked_logprobs(reported_logprobs, self.tokens.shape, "reported_logprobs").to(torch.float32)
        own = self.logprobs.to(reported.device)
        off = self.generated.to(reported.device) & ~((reported - own).abs() <= atol)
        if bool(off.any()):
            row, step = (int(i) for i in off.nonzero()[0])
            raise ValueError(f"row {row}, step {step}: the reported log-probability {float(reported[row, step])!r} "
                             f"differs from the replayed {float(own[row, step])!r} by more than atol={atol}.")

    def _step(self, step: int) -> int:
        steps = len(self.scores)
        if isinstance(step, bool) or not isinstance(step, int) or not -steps <= step < steps:
            raise IndexError(f"`step` must be an int in [0, {steps}) (one per generated token), got {step!r}.")
        return step


def _checked_logprobs(value: Any, shape: torch.Size, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        got = f"{value.dtype} tensor" if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(f"`{name}` must be a float tensor of shape (rows, new tokens) {tuple(shape)}, got {got}.")
    if value.shape != shape:
        raise ValueError(f"`{name}` must have shape (rows, new tokens) {tuple(shape)}, got {tuple(value.shape)}.")
    return value
