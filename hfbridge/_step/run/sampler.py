"""One decoding step: logits of any layout in, next tokens out, exactly as HF's `generate` picks them.

The stages, in order (names follow gpt-fast's one-verb-per-stage habit):
`rows` (extract, layout, vocab trim, float32 copy) -> `input_rows` (validate the context) ->
`process` (HF's `LogitsProcessorList`) -> `choose` (argmax, or softmax + `torch.multinomial`).
`sample_step` (`_step/run/sample_step.py`) is the same in one call.
"""


from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from hfbridge._step.checks.caller_inputs import extract_logits
from hfbridge._step.checks.step_errors import at_step, processors_stage
from hfbridge._step.plan.option_docs import fill_options
from hfbridge._step.run import sampler_choice as choice
from hfbridge._step.run import sampler_state as state
from hfbridge._step.run.cpu_shortcuts import greedy_choice
from hfbridge._step.run.layout import from_rows
from hfbridge._step.run.processor_list import Recorder
from hfbridge._step.run.route import Route, decide_route
from hfbridge._step.run.sampler_rows import float_copy
from hfbridge._step.run.sampler_setup import SamplerSetup
from hfbridge._step.run.sampler_state import StepResult
from hfbridge.processors._cpu_side import owned_scores

__all__ = ["Sampler", "StepResult", "extract_logits"]

Trace = list[tuple[Any, torch.Tensor]]  # (processor, (rows, vocab) scores after it), in the chain's order


class Sampler(SamplerSetup):
    """HF's decoding step built once and applied to many steps.

    Args:
        generation_config: A `transformers.GenerationConfig` to start from; never modified.
        processors: Your own `(input_ids, scores) -> scores` callables, merged with the built ones
            as HF's `generate` merges `logits_processor=`.
        layout: Axis names of the logits, e.g. `"b t v"` (default for 3-D), `"t b v"`, `"b v t"`,
            `"b v"` (default for 2-D), `"v"` (default for 1-D), `"t v"`, `"b k t v"`.
        vocab_size: The real vocabulary when the model's output is padded (50257 of 50304
            columns): the extra columns are dropped and can never be chosen. Default: all columns,
            or, with a `tokenizer`, the columns below its size (the rest are padding; pass the
            logits' width to keep them).
        do_sample: `True` samples, `False` is greedy. Default `None`: sample when any sampling
            option (`temperature`, `top_k`, `top_p`, `min_p`, `typical_p`, `epsilon_cutoff`,
            `eta_cutoff`, `top_h`) is passed, else follow `generation_config.do_sample`, else greedy.
        generator: A `torch.Generator` on the logits' device for reproducible draws that leave
            the global RNG alone, or a list with one per row: row i is then drawn from generator
            i only, as it would be alone (`docs/per_row.md`). Default: the global RNG, drawing
            exactly as HF does.
        prompt_length: Prompt tokens before generation; needed by `min_new_tokens`,
            `max_new_tokens`, `exponential_decay_length_penalty`, `begin_suppress_tokens`.
        attention_mask: `(batch, seq)` mask of a left-padded prompt (repetition penalty then
            skips the padding on transformers versions that do so).
        fast: Use hfbridge's fused sampling path: HF's distribution, not HF's random stream.
        prefix_allowed_tokens_fn: HF's constraint hook, `(batch_id, input_ids) -> list[int]`: the
            token ids allowed after the row's tokens `input_ids` `(seq,)` (`batch_id` is the row);
            built into HF's `PrefixConstrainedLogitsProcessor` where HF puts it.
        unconditional: For `guidance_scale`: `unconditional(input_ids) -> logits`, called once per
            step with the `(rows, seq)` tokens so far; returns the model's output on the
            unconditional (or negative) sequence, in the logits' layout, whose last position HF's
            classifier-free guidance mixes in (docs/guidance_watermark.md). `generate` makes these
            calls itself; `sample_step` takes the step's `unconditional_logits=`.
        tokenizer: For DRY's string sequence breakers (`dry_sequence_breakers`, whose default is strings);
            without `vocab_size`, the logits' columns from its size on are padding and dropped.
        thinking_options: The options that differ while a row is thinking (its last `thinking_start` tag
            not closed by a `thinking_end`; a prompt may open it): its step uses these options updated with
            `thinking_options`, e.g. `{"temperature": 0.9, "dry_multiplier": 0.8}`; outside, these options.
            The tags as for `thinking_budget` (strings with `tokenizer`, or token ids). See
            docs/samplers.md, "Phase-aware sampling". Default: none (one phase).
        **generation_kwargs: Any `GenerationConfig` option that becomes a logits processor, and the
            options of `hfbridge.processors`' samplers (`dry_multiplier`, `top_n_sigma`, ...). The
            numeric ones of HF (`temperature`, `top_k`, `top_p`, `min_p`, `typical_p`, `epsilon_cutoff`,
            `eta_cutoff`, `top_h`, `repetition_penalty`, `no_repeat_ngram_size`) take a number or
            one value per row (a list, tuple or 1-D tensor); a temperature of 0 makes its row greedy.
            [registry options]

    >>> import torch
    >>> sampler = Sampler(temperature=0.7, top_k=2)
    >>> [type(p).__name__ for p in sampler.processors]
    ['TemperatureLogitsWarper', 'TopKLogitsWarper']
    >>> sampler(torch.tensor([[0.0, 9.0, -9.0]]), torch.tensor([[1]])).shape
    torch.Size([1])
    """

    row_numbers: tuple[int, torch.Tensor] | None = None  # a phase's rows: (the batch's rows, (n,) its rows among them)












    def __call__(self, logits: Any, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Next tokens for `logits` given the context `input_ids`, shaped as the layout's batch axes."""
        view, ids, batch_shape = self.prepare(logits, input_ids)
        # check=True: a call on its own has no later host read to fold the fast path's flag into
        tokens = self.next_tokens(ids, view, check=True)  # [N]
        return tokens if len(batch_shape) == 1 else from_rows(tokens, batch_shape)





    def rows(self, logits: Any) -> torch.Tensor:
        """A float32 copy of the last-position logits as `(rows, vocab)`, padded vocabulary dropped.

        Raises `ValueError` for a layout that does not fit, too few columns for `vocab_size`, or NaN.
        """
        rows, bad = self._inputs.rows(logits, nan_allowed=self.generation_config.remove_invalid_values)
        if bad is not None:  # HF's InfNanRemoveLogitsProcessor turns NaN into 0: only without it
            raise self._rows_error(bad, rows, rows)
        return rows


    def route(self, *, keep_scores: bool = False, keep_raw: bool = False) -> Route:
        """The way this sampler's steps go: plain argmax, greedy, exact or fast (decided here, nowhere else).

        Args:
            keep_scores: The caller keeps the processed scores (the fast path keeps none: exact then).
            keep_raw: The caller keeps a float32 copy of the logits (no plain argmax then).
        """
        return decide_route(fast=self.fast, do_sample=self.do_sample, has_processors=bool(self._processors),
                            keep_scores=keep_scores, keep_raw=keep_raw)

    def next_tokens(self, input_ids: torch.Tensor, rows: torch.Tensor, *,
                    check: bool | None = None) -> torch.Tensor:
        """`(rows,)` next tokens from `(rows, vocab)` logits and `(rows, seq)` ids (see `input_rows`).

        `rows` is read, never modified (processors run on a float32 copy). This is `step` with its
        checks made here: exact mode raises at once for a row with nothing to choose.

        Args:
            check: Fast path only: read `invalid_rows` now and raise exact mode's error for a row
                that could not be sampled (`check_rows`). Default None: at once on CPU (free);
                on an accelerator, not here: call `check_rows()` where you read the device anyway.
        """
        if self._phases is not None:  # each row's phase, its own sampler (`_step/run/phases.py`)
            self._checked_processors(rows)
            return self._phases.next_tokens(input_ids, rows, check)
        result = self.step(input_ids, rows, defer=False)
        if result.explain is not None and (check or (check is None and rows.device.type == "cpu")):
            self.check_rows()
        return result.tokens

    def step(self, input_ids: torch.Tensor, rows: torch.Tensor, *, scores: torch.Tensor | None = None,
             route: Route | None = None, defer: bool = True,
             greedy: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] = greedy_choice,
             at: int | None = None, record: Recorder | Trace | None = None) -> StepResult:
        """The one step every host runs: the processors, then the choice, on the route `route` decides.

        Args:
            input_ids: `(rows, seq)` the tokens so far.
            rows: `(rows, vocab)` the model's logits; read, never written.
            scores: A float32 copy of `rows` the processors may write into, which the caller keeps (a loop
                keeping HF's raw logits passes the very tensor it keeps); default: one made here.
            route: The route, decided once by the caller (`route()`); default: `route()`.
            defer: Leave the rows with nothing to choose as a flag on the device (`StepResult.invalid`,
                no host read); False raises exact mode's error for them at once (greedy).
            greedy: The argmax (`greedy_choice`, or a loop's accelerator route).
            at: `generate`'s step number: its errors then name it as `generate` does.
            record: `record(processor, scores)` after each processor of the chain, in order, with a copy of the
                `(rows, vocab)` scores it left, as this very step computes them (fast path included: what the
                draw reads); or a list, to which the pairs are appended. `explain` is this step recorded.

        >>> result = Sampler(top_k=1, do_sample=True).step(None, torch.tensor([[0.0, 3.0, 1.0]]))
        >>> result.tokens.tolist(), result.invalid
        ([1], None)
        """
        processors = self._checked_processors(rows)
        if self._phases is not None:  # each row's phase, its own sampler's step (`_step/run/phases.py`)
            if record is not None:
                raise ValueError("a Sampler with `thinking_options` records each row's phase: call `explain_phases`.")
            phases = self._phases
            return at_step(at, lambda: phases.step(input_ids, rows))
        recorder = _appender(record) if isinstance(record, list) else record  # a pair per processor
        if route is None:
            route = self.route(keep_scores=scores is not None)
        if route is Route.ARGMAX:  # HF's argmax straight off the logits: no copy, nothing to process
            tokens, best = greedy(rows)  # [N], [N]: the best score is the validity check too
            return self._greedy_result(tokens, best, rows, None, defer)
        if route is Route.FAST:
            tokens = self._fast_tokens(input_ids, rows, processors, recorder) if at is None else \
                processors_stage(at, lambda: self._fast_tokens(input_ids, rows, processors, recorder))
            if self._flags.last is None:  # valid, known without a read
                return StepResult(tokens, None, None, None)
            return StepResult(tokens, None, self.invalid_rows, lambda: self.check_rows(True))
        ids = cast(torch.LongTensor, input_ids)
        if scores is None:  # the step's own copy: processors may write into it
            with owned_scores():
                scores = processors.run(ids, float_copy(rows), record=recorder) if at is None else \
                    processors_stage(at, lambda: processors.run(ids, float_copy(rows), record=recorder))  # [N, V]
        else:  # the caller keeps this very tensor (HF's raw logits)
            kept = scores
            scores = processors.run(ids, kept, record=recorder) if at is None else \
                processors_stage(at, lambda: processors.run(ids, kept, record=recorder))
        processed = scores
        if route is Route.EXACT:  # torch.multinomial reads its input: checked at once
            return StepResult(at_step(at, lambda: self.choose(processed, raw=rows)), scores, None, None)
        tokens, best = greedy(scores)  # [N], [N]
        return self._greedy_result(tokens, best, rows, scores, defer)



    def _greedy_result(self, tokens: torch.Tensor, best: torch.Tensor, rows: torch.Tensor,
                       scores: torch.Tensor | None, defer: bool) -> StepResult:
        """A greedy step's result: its rows' validity (NaN or -inf best scores) deferred, or checked now."""
        chosen = rows if scores is None else scores
        if not defer:
            self._check_best(best, chosen, rows)
            return StepResult(tokens, scores, None, None)
        return StepResult(tokens, scores, best, lambda: self.explain_invalid(~(best > _NEG_INF), rows, chosen))

    def _fast_tokens(self, input_ids: torch.Tensor, rows: torch.Tensor, processors: Any,
                     record: Recorder | None) -> torch.Tensor:
        """The fused path's tokens; the rows' validity kept for `invalid_rows` / `check_rows` (no host read)."""
        result = choice.fast_step(input_ids, rows, processors, generator=self.generator, row_state=self._rows,
                                  head_length=self._head_length, memo=self._fast_memo, record=record)
        self._flags.keep(result, rows)
        return result.tokens

    def process(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Run the processors (HF's order) on `(rows, vocab)` float32 scores, which HF's processors may modify.

        hfbridge's own processors leave `scores` as they are here, as in transformers' loop, which keeps that
        very tensor as the step's raw logits; they write in place only into the step's private copy
        (`next_tokens`).
        """
        processors = self._checked_processors(scores)
        if self._phases is not None:
            raise ValueError("a Sampler with `thinking_options` chooses each row with its phase's processors: "
                             "call `step` or `next_tokens`, not `process`.")
        return processors(cast(torch.LongTensor, input_ids), scores)  # [N, V]

    def choose(self, scores: torch.Tensor, *, raw: torch.Tensor | None = None) -> torch.Tensor:
        """HF's draw: `softmax` then `torch.multinomial(num_samples=1)` (per-row groups: each group's own, a
        temperature of 0 greedy); the sampling step's choice (`step` takes the argmax itself).

        Raises `ValueError` for a row with nothing left to choose (all -inf, or NaN), or with +inf;
        `raw`, the logits before processing, tells the model's NaN or +inf apart from the processors'.
        """
        self._check_generator(scores.device)
        return choice.choose(scores, generator=self.generator, rows=self._rows, do_sample=self.do_sample,
                             error=lambda bad, chosen: self._rows_error(bad, chosen if raw is None else raw, chosen))

    def _check_best(self, best: torch.Tensor, scores: torch.Tensor, raw: torch.Tensor | None) -> None:
        """One host read: is every row's best score finite (or +inf when greedy, HF's argmax)?"""
        bad = choice.invalid_best(best, self.do_sample)
        if bad is not None:
            raise self._rows_error(bad, scores if raw is None else raw, scores)

    def _rows_error(self, bad: torch.Tensor, raw: torch.Tensor, scores: torch.Tensor | None) -> ValueError:
        return choice.bad_rows_error(bad, raw, scores, processors=self._processors, do_sample=self.do_sample,
                                     row_numbers=self.row_numbers)

    def explain_invalid(self, bad: torch.Tensor, raw: torch.Tensor, scores: torch.Tensor | None = None) -> None:
        """Raise exact mode's `ValueError` for the rows `bad` (`(rows,)` bool) left with nothing to choose:
        NaN or +inf in the model's logits `raw` (sampling), or processors that removed every token."""
        raise self._rows_error(bad, raw, scores)

    @property
    def invalid_rows(self) -> torch.Tensor | None:
        """`(rows,)` bool on the logits' device: True for each row the last fast `next_tokens` call
        could not sample (see `check_rows`); None before such a call. Reading it makes no host read."""
        return self._phases.invalid if self._phases is not None else self._flags.invalid()  # phases': merged

    def check_rows(self, invalid: bool | None = None) -> None:
        """Raise exact mode's error if the last fast `next_tokens` call left a row it could not sample.

        The fast path draws without a host-device sync: it leaves `invalid_rows`, True for each row whose final
        scores hold NaN or `+inf` or nothing above `-inf`. This reads it (`next_tokens` at once on CPU, `__call__`
        and `sample_step` always; `generate` in its one host read per step) and lets go of the step's scores.

        Args:
            invalid: `bool(invalid_rows.any())` when the caller has already read it; default None
                reads it here (one host read).

        Raises:
            ValueError: exact mode's error for the first invalid row (NaN logits, NaN or `+inf`
                after the processors, or every token removed), naming the row.
        """
        if self._phases is not None:
            return self._phases.check_rows(invalid)
        found = self._flags.take(invalid)
        if found is not None:
            raise self._rows_error(*found)

    def _stateful(self) -> list[tuple[Any, torch.Tensor | None]]:
        """`(processor, its rows or None for the whole batch)` for each processor that keeps state per row."""
        if self._phases is not None:  # the phases' samplers' (the wrapper's own list never runs)
            return [item for sampler in self._phases.samplers() for item in sampler._stateful()]
        return state.stateful_of(self._processors, self._rows.copies)

    @property
    def is_stateful(self) -> bool:
        """Whether a processor of this sampler keeps state per row (mirostat): loops call `reset`,
        `reorder` and `rollback` then."""
        return bool(self._stateful())

    def reset(self) -> None:
        """Forget every row's state (a new sequence for every row): `sample_step` does this at each call."""
        for processor, _ in self._stateful():
            processor.reset()

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Row `i` now continues what row `beam_idx[i]` was (HF's beam reorder), for every stateful processor."""
        state.reorder(self._stateful_unphased("reorder"), beam_idx)

    def rollback(self, lengths: Any) -> None:
        """Each row now has `lengths[i]` tokens (an int: every row): its state goes back to that point."""
        found = self._stateful_unphased("rollback")
        if not isinstance(lengths, torch.Tensor):
            lengths = torch.full((self._batch_rows,), int(lengths), dtype=torch.long)
        state.rollback(found, lengths)

    def _stateful_unphased(self, what: str) -> list[tuple[Any, torch.Tensor | None]]:
        return state.refuse_phases(what) if self._phases is not None else self._stateful()

    def explain(self, input_ids: torch.Tensor, rows: torch.Tensor) -> tuple[Trace, torch.Tensor]:
        """One step that records what each processor did: `([(processor, (rows, vocab) scores after it)], tokens)`.

        This is `step(..., record=...)`, with the errors of rows left with nothing to choose raised at once: each
        processor runs once (a stateful one takes one step), the tokens are the step's own (exact or fast, per-row
        groups and generator lists included), and the recorded scores are what it chose from. `explain_step` is
        this, shown.

        >>> trace, tokens = Sampler(top_k=1, do_sample=True).explain(None, torch.tensor([[0.0, 3.0, 1.0]]))
        >>> [type(p).__name__ for p, _ in trace], tokens.tolist()
        (['TopKLogitsWarper'], [1])
        """
        if self._phases is not None:
            raise ValueError("a Sampler with `thinking_options` runs other processors per phase: call "
                             "`explain_phases` (explain_step does).")
        trace: Trace = []
        result = self.step(input_ids, rows, defer=False, record=trace)
        if result.explain is not None:  # the fast path's flags, read now
            self.check_rows()
        return trace, result.tokens

    def explain_phases(self, input_ids: torch.Tensor, rows: torch.Tensor
                       ) -> tuple[dict[int, Trace], torch.Tensor, list[bool], dict[int, bool]]:
        """`explain` with `thinking_options`: the phases' step, each phase's sampler recording its rows; `(each
        row's [(processor, (vocab,) scores after it)], (rows,) tokens, each row's phase (True: thinking), each
        row's do_sample)`; `explain_step` shows one row of it."""
        if self._phases is None:
            raise ValueError("`explain_phases` needs a Sampler with `thinking_options`; call `explain`.")
        self._checked_processors(rows)
        return self._phases.explain(input_ids, rows)


Sampler.__doc__ = fill_options(Sampler.__doc__)  # the registry's options, listed in help()


_NEG_INF = float("-inf")


def _appender(trace: Trace) -> Recorder:
    return lambda processor, scores: trace.append((processor, scores))
