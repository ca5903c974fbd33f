"""The data of a comparison of settings on the same draws: `StepComparisonRecord`, `GenerationComparisonRecord`.

`compare.py` builds them (one `explain_step` recording, or one `generate` call, per setting, each from the
same generator state); `compare_html.py` shows them; `compare.StepComparison` and
`compare.GenerationComparison` are these records with their HTML. Below both, so that neither imports
the other.

>>> first_difference([[1, 2, 3], [1, 2, 4]]), first_difference([[1, 2], [1, 2]]), first_difference([[1, 2], [1]])
(2, None, 1)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from hfbridge._views.step_record import WHYS

if TYPE_CHECKING:  # pragma: no cover
    from hfbridge._generate.banned import Rewind
    from hfbridge._views.generation_record import GenerationRecord
    from hfbridge._views.step_record import StepRecord

__all__ = ["GenerationComparisonRecord", "StageDifference", "StepComparisonRecord", "first_difference",
           "options_text"]

SHOWN = 8  # token ids listed per difference in text and HTML (the rest counted)


def first_difference(sequences: list[list[int]]) -> int | None:
    """The first index where the sequences differ (a sequence ending where another goes on counts), or None."""
    if len(sequences) < 2:
        return None
    shortest = min(len(sequence) for sequence in sequences)
    for index in range(shortest):
        if len({sequence[index] for sequence in sequences}) > 1:
            return index
    return None if all(len(sequence) == shortest for sequence in sequences) else shortest


def options_text(options: dict[str, Any]) -> str:
    """``name=value, ...`` of a setting's options (tensors by shape, long lists cut)."""
    parts = []
    for name, value in options.items():
        if isinstance(value, torch.Tensor):
            text = f"tensor{tuple(value.shape)}" if value.numel() > 4 else str(value.tolist())
        elif isinstance(value, float):
            text = f"{value:g}"
        else:
            text = repr(value)
        parts.append(f"{name}={text if len(text) <= 40 else text[:39] + '…'}")
    return ", ".join(parts) or "(no options)"


@dataclass(frozen=True)
class StageDifference:
    """What one stage of one setting removed that another setting keeps to the end.

    Attributes:
        setting: The setting's name.
        stage: The stage's index in that setting's trace (``traces[setting].stages``).
        label: The stage's label (``TopPLogitsWarper(top_p=0.9)``).
        removed: The token ids this stage removed (finite before it, ``-inf`` after), most likely first
            under the model's scores.
        kept_by: For each other setting, the ids of ``removed`` that it still allows after its last stage.
    """

    setting: str
    stage: int
    label: str
    removed: list[int]
    kept_by: dict[str, list[int]]


@dataclass(frozen=True)
class StepComparisonRecord:
    """One step under several settings, each from the same generator state (`compare_step`'s result).

    Attributes:
        settings: Each setting's options as run (the common ones included), by name, in the given order.
        tokens: The tokens each setting chose, as `sample_step` returns them (the layout's batch shape).
        traces: The `explain_step` trace of the explained row, per setting.
        row: The explained row.
        tokenizer: Used to show tokens as text. Default: ``None`` (ids are shown).
    """

    settings: dict[str, dict[str, Any]]
    tokens: dict[str, torch.Tensor]
    traces: Mapping[str, StepRecord]
    row: int
    tokenizer: Any = field(default=None, repr=False, compare=False)

    @property
    def first_difference(self) -> int | None:
        """0 when the settings chose different tokens in any row, None when every row agrees."""
        rows = [tokens.reshape(-1).tolist() for tokens in self.tokens.values()]
        return None if first_difference(rows) is None else 0

    def kept(self, name: str) -> list[int]:
        """The token ids setting ``name`` still allows after its last stage (explained row), most likely first."""
        final = self.traces[name].stages[-1].scores
        allowed = torch.nonzero(final > float("-inf")).flatten()
        return allowed[torch.argsort(final[allowed], descending=True, stable=True)].tolist()

    @property
    def differences(self) -> list[StageDifference]:
        """Per setting, per stage that removed a token: what it removed that another setting keeps."""
        kept = {name: set(self.kept(name)) for name in self.traces}
        found = []
        for name, trace in self.traces.items():
            model = trace.stages[0].scores
            for index in range(1, len(trace.stages)):
                before, after = trace.stages[index - 1].scores, trace.stages[index].scores
                gone = torch.nonzero((before > float("-inf")) & (after == float("-inf"))).flatten()
                if not len(gone):
                    continue
                removed = gone[torch.argsort(model[gone], descending=True, stable=True)].tolist()
                kept_by = {other: [t for t in removed if t in kept[other]] for other in self.traces if other != name}
                found.append(StageDifference(name, index, trace.stages[index].label, removed, kept_by))
        return found

    def moves(self, name: str, stage: int) -> list[tuple[int, float, float]]:
        """Why the settings part: ``(token, p before, p after)`` for each token some setting chose (explained
        row) whose probability stage ``stage`` of setting ``name`` changed."""
        trace = self.traces[name]
        before, after = trace.stages[stage - 1].probs(), trace.stages[stage].probs()
        chosen = dict.fromkeys(trace.token for trace in self.traces.values())
        return [(token, float(before[token]), float(after[token])) for token in chosen
                if abs(float(before[token]) - float(after[token])) > 5e-4]

    def label(self, token: int) -> str:
        return f"#{token}" if self.tokenizer is None else repr(self.tokenizer.decode([token]))

    def labels(self, tokens: list[int]) -> str:
        shown = ", ".join(self.label(token) for token in tokens[:SHOWN])
        return shown + (f" (+{len(tokens) - SHOWN} more)" if len(tokens) > SHOWN else "")

    def summary(self) -> str:
        chosen = "; ".join(f"{name}: {self.label(trace.token)}" for name, trace in self.traces.items())
        agree = "the same tokens in every row" if self.first_difference is None else "different tokens"
        return f"compare_step, row {self.row}: {chosen} ({agree}, from the same draws)"

    def __str__(self) -> str:
        lines = [self.summary()]
        for name, trace in self.traces.items():
            lines += ["", f"[{name}] {options_text(self.settings[name])}",
                      f"    chose {self.label(trace.token)}, p={float(trace.stages[-1].probs()[trace.token]):.3f}; "
                      f"{trace.stages[-1].possible} candidates left"]
            differences = {d.stage: d for d in self.differences if d.setting == name}
            for number in range(1, len(trace.stages)):
                stage, difference = trace.stages[number], differences.get(number)
                removed = "" if difference is None else f", removed {len(difference.removed)}"
                lines.append(f"    {stage.label}: {trace.changed_text(number)}{removed}, {stage.possible} left")
                lines += [f"        why: {reason}" for reason in trace.why(number, most=WHYS)]
                for other, tokens in ({} if difference is None else difference.kept_by).items():
                    if tokens:
                        lines.append(f"        that {other} keeps: {self.labels(tokens)}")
                moved = self.moves(name, number)
                if moved and self.first_difference is not None:
                    lines.append("        " + ", ".join(f"{self.label(t)} p {a:.3f} -> {b:.3f}" for t, a, b in moved))
        return "\n".join(lines)

    __repr__ = __str__


@dataclass(frozen=True)
class GenerationComparisonRecord:
    """One generation under several settings, each from the same generator state (`compare_generation`'s).

    Attributes:
        settings: Each setting's options as run (the common ones included), by name, in the given order.
        tokens: The sequences each setting's `generate` returned (prompt included).
        outputs: Each `generate` call's output (``return_dict_in_generate=True``, ``output_scores=True``).
        traces: The `explain_generation` trace of the explained row, per setting.
        prompt_length: Columns of the prompt in ``tokens``.
        row: The explained row.
        tokenizer: Used to show tokens as text. Default: ``None`` (ids are shown).
        reasons: Per setting, why its DRY and thinking budget did what they did where the explained row parts.
            Default: none.
        rollbacks: Per setting, every rollback its banned strings made (`Rewind`s of every row, in order).
            Default: none.
    """

    settings: dict[str, dict[str, Any]]
    tokens: dict[str, torch.Tensor]
    outputs: dict[str, Any] = field(repr=False)
    traces: Mapping[str, GenerationRecord] = field(repr=False)
    prompt_length: int
    row: int
    tokenizer: Any = field(default=None, repr=False, compare=False)
    rollbacks: dict[str, list[Rewind]] = field(default_factory=dict, repr=False)
    reasons: dict[str, list[Any]] = field(default_factory=dict, repr=False)

    def why(self, name: str) -> list[str]:
        """Why setting ``name``'s DRY and thinking budget did what they did at the step where the explained row
        parts, in words (``reasons[name]``): DRY's repeats, the budget's count or forced token."""
        return [reason.text(self.label) for reason in self.reasons.get(name, [])]

    def rolled_back(self, name: str) -> list[str]:
        """Which ban rolled back which steps of the explained row, setting ``name``, in words (in order):
        ``"steps 3-4 'c c' taken back: banned 'c c' matched 'c c'; 'c' forbidden at step 3"``."""
        lines = []
        for rewind in self.rollbacks.get(name, []):
            if rewind.row != self.row:
                continue
            first = rewind.position - self.prompt_length
            steps = f"step {first}" if rewind.taken == 1 else f"steps {first}-{first + rewind.taken - 1}"
            lines.append(f"{steps} {rewind.text!r} taken back: banned {rewind.ban!r} matched {rewind.match!r}; "
                         f"{self.label(rewind.token)} forbidden at step {first}")
        return lines

    def _generated(self, row: int) -> list[list[int]]:
        return [tokens[row, self.prompt_length:].tolist() for tokens in self.tokens.values()]

    @property
    def first_difference(self) -> int | None:
        """The first generated step (0: the first new token) where the settings' tokens differ in any row
        (a row that ends where another goes on counts), or None when every row is the same."""
        rows = next(iter(self.tokens.values())).shape[0]
        found = [first_difference(self._generated(row)) for row in range(rows)]
        return min((step for step in found if step is not None), default=None)

    @property
    def row_difference(self) -> int | None:
        """`first_difference` for the explained row alone."""
        return first_difference(self._generated(self.row))

    def candidates(self, name: str, step: int) -> list[int]:
        """The token ids setting ``name`` allowed at generated ``step`` (explained row), most likely first."""
        trace = self.traces[name]
        scores = _step_scores(self.outputs[name], trace, step)
        allowed = torch.nonzero(scores > float("-inf")).flatten()
        return allowed[torch.argsort(scores[allowed], descending=True, stable=True)].tolist()

    def prob(self, name: str, step: int, token: int) -> float:
        """The probability setting ``name`` gave ``token`` at generated ``step`` (explained row, processed)."""
        return float(torch.softmax(_step_scores(self.outputs[name], self.traces[name], step), dim=-1)[token])

    def others_chosen(self, name: str, step: int) -> list[tuple[str, int, float]]:
        """Why the settings part at ``step``: ``(other setting, the token it chose, the probability setting
        ``name`` gave that token)`` for each other setting that chose differently."""
        own = self.traces[name].steps[step].token
        found = []
        for other, trace in self.traces.items():
            if other != name and step < len(trace.steps) and trace.steps[step].token != own:
                found.append((other, trace.steps[step].token, self.prob(name, step, trace.steps[step].token)))
        return found

    def only_in(self, name: str, step: int) -> list[int]:
        """Candidates of setting ``name`` at ``step`` that every other setting had removed there."""
        others = [set(self.candidates(other, step)) for other in self.traces if other != name]
        return [token for token in self.candidates(name, step) if not any(token in other for other in others)]

    def text(self, name: str, start: int = 0) -> str:
        """The explained row's generated text (or ids) of setting ``name`` from generated step ``start`` on."""
        ids = self.tokens[name][self.row, self.prompt_length + start:].tolist()
        return " ".join(map(str, ids)) if self.tokenizer is None else self.tokenizer.decode(ids)

    def label(self, token: int) -> str:
        return f"#{token}" if self.tokenizer is None else repr(self.tokenizer.decode([token]))

    def summary(self) -> str:
        step = self.row_difference
        steps = len(next(iter(self.traces.values())).steps)
        if step is None:
            return f"compare_generation, row {self.row}: every setting generated the same {steps} tokens"
        return (f"compare_generation, row {self.row}: the settings agree for {step} token(s), then part at step "
                f"{step} (same draws)")

    def __str__(self) -> str:
        lines = [self.summary()]
        step = self.row_difference
        for name in self.traces:
            lines += ["", f"[{name}] {options_text(self.settings[name])}"]
            if step is not None and step < len(self.traces[name].steps):
                at = self.traces[name].steps[step]
                only = self.only_in(name, step)
                lines.append(f"    step {step}: {self.label(at.token)} p={at.prob:.3f}, "
                             f"{at.possible} candidates" + (f", {len(only)} no other setting allowed" if only else ""))
                for other, token, p in self.others_chosen(name, step):
                    lines.append(f"    {other}'s {self.label(token)} had p={p:.3f} here")
                lines += [f"    why: {reason}" for reason in self.why(name)]
            lines += [f"    rolled back: {line}" for line in self.rolled_back(name)]
            lines.append("    " + repr(self.text(name, step or 0))[:300])
        return "\n".join(lines)

    __repr__ = __str__


def _step_scores(output: Any, trace: GenerationRecord, step: int) -> torch.Tensor:
    """The processed scores ``(vocab,)`` of the traced row at generated ``step``."""
    scores = output.scores[step]  # [rows, V]
    return scores[trace.row].detach().float().cpu()
