"""The data of one explained step: `Stage` and `StepRecord`, below everything that shows them.

`explain_step` builds them; `step_html.py` and `step_plot.py` read them; `explain_step.StepTrace`
is a `StepRecord` that shows itself (HTML in Jupyter, ``.plot()``).

>>> import torch
>>> params_text({"temperature": 0.5, "min_tokens_to_keep": 1})
'temperature=0.5'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["WHYS", "Stage", "StepRecord", "format_score", "params_text"]

WHYS = 6  # reasons shown per stage in text and HTML (DRY may penalise dozens of tokens); the rest counted


@dataclass(frozen=True)
class Stage:
    """The distribution of one row at one point of the step.

    Attributes:
        name: ``"input"`` for the model's scores, else the processor's class name (with its
            package in front when it is neither transformers' nor hfbridge's: ``xgrammar.LogitsProcessor``).
        params: The processor's constructor settings (``{"temperature": 0.7}``); empty for the input.
        scores: ``(vocab,)`` float32 scores after this stage; ``-inf`` marks removed tokens.
        top_ids: Ids of the ``top`` highest-scoring tokens still possible, best first.
        top_scores: Their scores.
        top_probs: Their softmax probabilities.
        possible: How many tokens still have a finite score.
        entropy: Entropy of the softmax distribution, in nats.
        changed: How many scores this stage changed (``None`` for the input). A stage that changed
            none of the tokens shown changed 0, or only tokens below them (a repetition penalty
            on the prompt's tokens when none of them is likely).
        reasons: Why, in the processor's own terms, for the samplers that say (their ``describe_last``):
            DRY's `DRYMatch` per penalised token, XTC's `XTCCoin`, the thinking budget's `BudgetState`;
            each has ``.text(label)`` and ``.tokens``. Empty for the others.
    """

    name: str
    params: dict[str, Any]
    scores: torch.Tensor = field(repr=False)
    top_ids: list[int]
    top_scores: list[float]
    top_probs: list[float]
    possible: int
    entropy: float
    changed: int | None = None
    reasons: tuple[Any, ...] = ()

    @property
    def label(self) -> str:
        """``Name(param=value, ...)``, or ``input`` (HF's default ``min_tokens_to_keep=1`` is not shown)."""
        if not _shown(self.params):
            return self.name
        return f"{self.name}({self.params_text})"

    @property
    def params_text(self) -> str:
        """``param=value, ...`` as shown in tables and plots (without HF's default ``min_tokens_to_keep=1``)."""
        return params_text(self.params)

    @property
    def short_name(self) -> str:
        """The name without HF's ``LogitsProcessor``/``LogitsWarper`` suffix (``TopP``)."""
        for suffix in ("LogitsProcessor", "LogitsWarper"):
            stem = self.name[: -len(suffix)]
            if self.name.endswith(suffix) and stem.isidentifier():
                return stem
        return self.name

    def probs(self) -> torch.Tensor:
        """``(vocab,)`` softmax probabilities of this stage."""
        return torch.softmax(self.scores, dim=-1)


@dataclass(frozen=True)
class StepRecord:
    """What `explain_step` recorded, as data and text: `StepTrace` adds its HTML and plot.

    Attributes:
        stages: The input distribution, then one `Stage` per processor, in the order they ran.
        token: The token id chosen for the explained row.
        row: Which row of the batch is explained.
        batch_rows: How many rows the step had.
        do_sample: Whether the token was drawn (``True``) or taken by argmax (``False``).
        tokenizer: Used only to show tokens as text. Default: ``None`` (ids are shown).
        phase: With ``thinking_options``: the row's phase, ``"thinking"`` or ``"answer"``; else ``None``.
    """

    stages: list[Stage]
    token: int
    row: int
    batch_rows: int
    do_sample: bool
    tokenizer: Any = field(default=None, repr=False, compare=False)
    phase: str | None = None  # with `thinking_options`: "thinking" or "answer"

    @property
    def token_text(self) -> str | None:
        """The chosen token decoded by the tokenizer, or ``None`` without one."""
        return None if self.tokenizer is None else self.tokenizer.decode([self.token])

    def token_label(self, token_id: int) -> str:
        """How a token is shown: its text (``repr`` of the decoded string) or ``#id``."""
        if self.tokenizer is None:
            return f"#{token_id}"
        return repr(self.tokenizer.decode([token_id]))

    def changed_text(self, number: int) -> str:
        """What stage `number` changed, in words: ``"changed 3 scores (none shown)"``; empty for the input."""
        stage = self.stages[number]
        if stage.changed is None:
            return ""
        if stage.changed == 0:
            return "changed no score"
        previous = self.stages[number - 1]
        shown = set(stage.top_ids) | set(previous.top_ids)
        moved = bool(torch.ne(stage.scores[list(shown)], previous.scores[list(shown)]).any())
        return f"changed {stage.changed} score{'s' if stage.changed != 1 else ''}" + ("" if moved else " (none shown)")

    def why(self, number: int, *, most: int | None = None) -> list[str]:
        """Stage `number`'s reasons in words (tokens as `token_label` shows them): ``["coin 0.42 < 0.5: fired;
        ..."]``; empty when the stage's processor says none. ``most``: at most that many, then ``"+N more"``."""
        reasons = self.stages[number].reasons
        shown = reasons if most is None else reasons[:most]
        more = [f"+{len(reasons) - len(shown)} more"] if len(reasons) > len(shown) else []
        return [reason.text(self.token_label) for reason in shown] + more

    def summary(self) -> str:
        """One line: the row, the chosen token, how it was chosen and its final probability."""
        how = "drawn by sampling" if self.do_sample else "taken greedily (argmax)"
        token = f"token {self.token}" + (f" {self.token_label(self.token)}" if self.tokenizer is not None else "")
        p = self.stages[-1].probs()[self.token].item()
        processors = len(self.stages) - 1
        phase = f" ({self.phase})" if self.phase is not None else ""
        return (f"row {self.row} of {self.batch_rows}{phase}: {token} {how}, p={p:.3f} after {processors} "
                "processor(s)")

    def __str__(self) -> str:
        lines = [f"explain_step: {self.summary()}"]
        width = max(8, *(len(self.token_label(i)) for s in self.stages for i in s.top_ids))
        width = min(width, 24)
        for number, stage in enumerate(self.stages):
            lines.append("")
            lines.append(f"[{number}] {stage.label}")
            lines.append(f"    possible {stage.possible}   entropy {stage.entropy:.3f} nats"
                         + ("" if stage.changed is None else f"   {self.changed_text(number)}"))
            lines += [f"    why: {reason}" for reason in self.why(number, most=WHYS)]
            lines.append(f"    {'rank':>4}  {'token':<{width}}  {'score':>9}  {'prob':>6}")
            for rank, (token_id, score, prob) in enumerate(zip(stage.top_ids, stage.top_scores, stage.top_probs), 1):
                mark = "  <- chosen" if token_id == self.token else ""
                label = _clip(self.token_label(token_id), width)
                lines.append(f"    {rank:>4}  {label:<{width}}  {score:>9.3f}  {prob:>6.3f}{mark}")
        return "\n".join(lines)

    __repr__ = __str__


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def format_score(score: float) -> str:
    return "-inf" if score == float("-inf") else f"{score:.2f}"


def params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_format_value(v)}" for k, v in _shown(params).items())


def _shown(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters worth displaying: HF's default `min_tokens_to_keep=1` only adds noise, and a
    `repetition_penalty` of 1 is off (the penalties' window carries one, 1 unless it was set)."""
    return {k: v for k, v in params.items() if not (k in ("min_tokens_to_keep", "repetition_penalty") and v == 1)}


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
