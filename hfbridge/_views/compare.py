"""What another setting would have done here, with the same random draws: `compare_step`, `compare_generation`.

Each setting runs the one real step (`explain_step`'s recording of `Sampler`'s step) or the one real loop
(`generate`) from the same generator state, put back before each setting: so ``.tokens[name]`` is exactly
what `sample_step` / `generate` return for that setting and that state, and where two settings keep the
same candidates with the same probabilities, they draw the same token.

>>> import torch
>>> logits = torch.tensor([[2.0, 1.5, 1.0, -1.0]])
>>> result = compare_step(logits, None, {"top-k 1": dict(top_k=1), "top-k 3": dict(top_k=3)},
...                       generator=torch.Generator().manual_seed(0), do_sample=True)
>>> result.tokens["top-k 1"].tolist(), result.kept("top-k 3")
([0], [0, 1, 2])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hfbridge._generate.banned import BannedStrings
from hfbridge._generate.generate import generate
from hfbridge._step.plan.hf_option_rows import HF_OPTION_ROWS
from hfbridge._views.compare_html import generation_html, step_html
from hfbridge._views.comparison_record import GenerationComparisonRecord, StepComparisonRecord, first_difference
from hfbridge._views.explain_generation import explain_generation
from hfbridge._views.explain_step import record_step
from hfbridge._views.generation_why import parting_reasons
from hfbridge._views.html import page

__all__ = ["GenerationComparison", "StepComparison", "compare_generation", "compare_step"]

_OWN = ("generator", "tokenizer", "input_ids", "logits", "model", "top", "row", "max_new_tokens",
        "return_dict_in_generate", "output_scores")
# besides the options that select another strategy (the registry's `selects`): a draft model, a streamer
_REFUSED = ("assistant_model", "streamer")


class StepComparison(StepComparisonRecord):
    """`compare_step`'s result: the settings side by side (HTML in Jupyter, text with ``print``).

    Attributes:
        settings: Each setting's options as run (the common ones included), by name, in the given order.
        tokens: The tokens each setting chose, as `sample_step` returns them (the layout's batch shape).
        traces: The `explain_step` trace (`StepTrace`) of the explained row, per setting.
        row: The explained row.
        tokenizer: Used to show tokens as text.
    """

    def _repr_html_(self) -> str:
        return step_html(self)

    def to_html(self) -> str:
        """A standalone HTML page: the comparison as Jupyter shows it, anywhere."""
        return page(self._repr_html_(), self.summary())


class GenerationComparison(GenerationComparisonRecord):
    """`compare_generation`'s result: the texts side by side from where they part.

    Attributes:
        settings: Each setting's options as run (the common ones included), by name, in the given order.
        tokens: The sequences each setting's `generate` returned (prompt included).
        outputs: Each `generate` call's output (``return_dict_in_generate=True``, ``output_scores=True``).
        traces: The `explain_generation` trace (`GenerationTrace`) of the explained row, per setting.
        prompt_length: Columns of the prompt in ``tokens``.
        row: The explained row.
        tokenizer: Used to show tokens as text.
        rollbacks: Per setting, every rollback of its banned strings (`Rewind`s, every row), in order.
        reasons: Per setting, why its DRY and thinking budget did what they did at the step where the explained
            row parts (`DRYMatch`, `BudgetState`).
    """

    def _repr_html_(self) -> str:
        return generation_html(self)

    def to_html(self) -> str:
        """A standalone HTML page: the comparison as Jupyter shows it, anywhere."""
        return page(self._repr_html_(), self.summary())


def compare_step(logits: Any, input_ids: torch.Tensor | None, settings: Mapping[str, Mapping[str, Any]], *,
                 generator: torch.Generator | Sequence[torch.Generator] | None = None, tokenizer: Any = None,
                 top: int = 10, row: int = 0, **options: Any) -> StepComparison:
    """One step under each setting, every setting from the same random draws.

    Args:
        logits: The model's output for the step, as for `sample_step` (any layout, dtype, padded vocabulary).
        input_ids: ``(*batch, seq)`` tokens so far, or None.
        settings: A name for each setting and its options (``{"top-p": dict(top_p=0.9), "min-p":
            dict(min_p=0.05)}``): anything `sample_step` takes, per-row values and ``processors=`` included
            (a stateful processor of your own runs once per setting: give each setting its own).
        generator: One ``torch.Generator`` or one per row; its state is put back before each setting, and
            left as the first setting left it. Default: None, torch's global generator, replayed the same way.
        tokenizer: Shows tokens as text (and serves DRY's string breakers, padded vocabularies), as in
            `sample_step`.
        top: Tokens recorded per stage, as in `explain_step`. Default: ``10``.
        row: The row explained stage by stage. Default: ``0``.
        **options: Options common to every setting (a setting's own value wins).

    Returns:
        A `StepComparison`: ``.tokens[name]`` is what ``sample_step(logits, input_ids, **options,
        **settings[name], generator=...)`` returns from the same generator state.

    Raises:
        TypeError: ``settings`` is not a mapping of names to option mappings, or a setting names one of
            the comparison's own arguments (``generator``, ``tokenizer``, ``top``, ``row``, ...).
    """
    runs = _settings(settings, options, "compare_step")
    draws = _Draws(generator, _device(logits))
    tokens, traces = {}, {}
    for name, setting in runs.items():
        draws.replay()
        traces[name], tokens[name] = record_step(logits, input_ids, tokenizer=tokenizer, top=top, row=row,
                                                 generator=generator, **setting)
        draws.after_first()
    draws.finish()
    return StepComparison(settings=runs, tokens=tokens, traces=traces, row=row, tokenizer=tokenizer)


def compare_generation(model: Any, input_ids: torch.Tensor, settings: Mapping[str, Mapping[str, Any]], *,
                       max_new_tokens: int, generator: torch.Generator | Sequence[torch.Generator] | None = None,
                       tokenizer: Any = None, top: int = 5, row: int = 0, **options: Any) -> GenerationComparison:
    """One generation under each setting, every setting from the same random draws.

    Args:
        model: Any model form `generate` takes (a callable, `Recompute`, `ReturnsCache`, ...). Each
            setting calls it from the start.
        input_ids: ``(batch, seq)`` prompt.
        settings: A name for each setting and its options (``{"no DRY": {}, "DRY": dict(dry_multiplier=0.8)}``):
            anything `generate` takes for greedy search or sampling, per-row values included.
        max_new_tokens: New tokens per setting.
        generator: One ``torch.Generator`` or one per row; its state is put back before each setting, and
            left as the first setting left it. Default: None, torch's global generator, replayed the same way.
        tokenizer: Shows tokens as text (and serves stop strings, banned strings, DRY's breakers), as in
            `generate`.
        top: Alternatives kept per step in the traces. Default: ``5``.
        row: The row shown side by side. Default: ``0``.
        **options: Options common to every setting (``do_sample=True``, ``temperature=0.8``, ``attention_mask=``,
            ...; a setting's own value wins).

    Returns:
        A `GenerationComparison`: ``.tokens[name]`` is what `generate` returns for that setting from the same
        generator state; ``.first_difference`` the first new token where the settings part.

    Raises:
        TypeError: as `compare_step`; ``ValueError`` for an option that selects another strategy than greedy
            search or sampling (beams, drafts, contrastive search, ...) or a streamer (they do not compare token
            by token on the same draws).
    """
    runs = _settings(settings, options, "compare_generation")
    for name, setting in runs.items():
        refused = [row.name for row in HF_OPTION_ROWS.values() if row.selects is not None
                   and _selects(row.selects, setting.get(row.name))]
        refused += [key for key in _REFUSED if setting.get(key) is not None]
        if refused:
            raise ValueError(f"compare_generation: settings[{name!r}] sets `{refused[0]}`; the comparison runs "
                             "greedy search and sampling, token by token on the same draws (no beams, drafts or "
                             "streamer).")
    draws = _Draws(generator, input_ids.device if isinstance(input_ids, torch.Tensor) else None)
    outputs, tokens, traces, rollbacks = {}, {}, {}, {}
    for name, setting in runs.items():
        run, bans = _with_bans(setting, tokenizer)
        draws.replay()
        outputs[name] = generate(model, input_ids, max_new_tokens=max_new_tokens, generator=generator,
                                 tokenizer=tokenizer, return_dict_in_generate=True, output_scores=True, **run)
        draws.after_first()
        tokens[name] = outputs[name].sequences
        rollbacks[name] = [] if bans is None else list(bans.rewinds)
    draws.finish()
    shapes = {name: tuple(sequences.shape[:1]) for name, sequences in tokens.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"compare_generation: the settings gave different numbers of rows {shapes}; give them "
                         "the same `num_return_sequences`.")
    for name in runs:
        traces[name] = explain_generation(outputs[name], tokenizer, row=row, top=top)
    prompt = input_ids.shape[-1]
    step = first_difference([sequences[row, prompt:].tolist() for sequences in tokens.values()])
    reasons = {name: parting_reasons(runs[name], tokens[name], prompt, step, row, outputs[name].scores[0].shape[-1],
                                     tokenizer) if step is not None and step < len(traces[name].steps) else []
               for name in runs}  # why each setting did what it did where they part: DRY, a thinking budget
    return GenerationComparison(settings=runs, tokens=tokens, outputs=outputs, traces=traces, prompt_length=prompt,
                                row=row, tokenizer=tokenizer, rollbacks=rollbacks, reasons=reasons)


def _selects(selects: Any, value: Any) -> bool:
    """Whether `value` selects another strategy than greedy search or sampling; a value the row cannot read is
    left to `generate`'s own check, which names it."""
    try:
        return bool(selects(value))
    except (TypeError, ValueError, RuntimeError):
        return False


def _with_bans(setting: dict[str, Any], tokenizer: Any) -> tuple[dict[str, Any], BannedStrings | None]:
    """The setting as `generate` runs it, its banned strings as a `BannedStrings` of ours (or the caller's),
    whose ``rewinds`` say afterwards which ban rolled back which steps; None without bans."""
    if isinstance(setting.get("banned_strings"), BannedStrings):
        return setting, setting["banned_strings"]
    if tokenizer is None or (setting.get("banned_strings") is None and setting.get("banned_regex") is None):
        return setting, None  # no bans, or generate's own error for bans without a tokenizer
    run = {key: value for key, value in setting.items() if key not in ("banned_strings", "banned_regex",
                                                                        "banned_max_rewinds")}
    limit = setting.get("banned_max_rewinds")
    bans = BannedStrings(tokenizer, setting.get("banned_strings"), setting.get("banned_regex"),
                         **({} if limit is None else {"max_rewinds": limit}))
    return {**run, "banned_strings": bans}, bans


def _settings(settings: Any, common: dict[str, Any], caller: str) -> dict[str, dict[str, Any]]:
    """Each setting's options (the common ones, then its own), checked."""
    if not isinstance(settings, Mapping) or not settings:
        raise TypeError(f"{caller}: `settings` must be a non-empty mapping of names to option mappings "
                        f"({{'top-p': dict(top_p=0.9), 'min-p': dict(min_p=0.05)}}), got {type(settings).__name__}"
                        + (" (empty)" if isinstance(settings, Mapping) else "") + ".")
    for key in common:
        if key in _OWN[3:]:
            raise TypeError(f"{caller}() got an unexpected keyword argument `{key}`")
    runs = {}
    for name, setting in settings.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"{caller}: each setting's name must be a non-empty str, got {name!r}.")
        if not isinstance(setting, Mapping):
            raise TypeError(f"{caller}: settings[{name!r}] must be a mapping of options (dict(top_p=0.9)), "
                            f"got {type(setting).__name__}.")
        own = [key for key in setting if key in _OWN]
        if own:
            raise TypeError(f"{caller}: settings[{name!r}] sets `{own[0]}`, which is the comparison's own argument "
                            f"(one for every setting): pass it to {caller}() itself.")
        runs[name] = {**common, **setting}
    return runs


def _device(logits: Any) -> torch.device | None:
    if isinstance(logits, torch.Tensor):
        return logits.device
    found = logits.get("logits") if isinstance(logits, Mapping) else getattr(logits, "logits", None)
    if isinstance(found, torch.Tensor):
        return found.device
    if isinstance(logits, (tuple, list)) and logits and isinstance(logits[0], torch.Tensor):
        return logits[0].device
    return None


class _Draws:
    """One generator state (or torch's global one), put back before each setting."""

    def __init__(self, generator: Any, device: torch.device | None):
        if generator is None:
            self.generators: list[torch.Generator] = []
        elif isinstance(generator, torch.Generator):
            self.generators = [generator]
        elif isinstance(generator, (list, tuple)) and generator and all(
                isinstance(g, torch.Generator) for g in generator):
            self.generators = list(generator)
        else:
            raise TypeError(f"`generator` must be a torch.Generator, a list of them (one per row) or None, "
                            f"got {type(generator).__name__}.")
        self.cuda = generator is None and device is not None and device.type == "cuda"
        self.start = self._state()
        self.first: list[torch.Tensor] | None = None

    def _state(self) -> list[torch.Tensor]:
        if self.generators:
            return [g.get_state() for g in self.generators]
        return [torch.get_rng_state(), *(torch.cuda.get_rng_state_all() if self.cuda else [])]

    def _set(self, states: list[torch.Tensor]) -> None:
        if self.generators:
            for g, state in zip(self.generators, states):
                g.set_state(state)
            return
        torch.set_rng_state(states[0])
        if self.cuda:
            torch.cuda.set_rng_state_all(states[1:])

    def replay(self) -> None:
        self._set(self.start)

    def after_first(self) -> None:
        if self.first is None:
            self.first = self._state()

    def finish(self) -> None:
        if self.first is not None:
            self._set(self.first)
