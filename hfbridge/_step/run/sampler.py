"""One decoding step: logits of any layout in, next tokens out, exactly as HF's `generate` picks them.

The stages, in order (names follow gpt-fast's one-verb-per-stage habit):
`rows` (extract, layout, vocab trim, float32 copy) -> `input_rows` (validate the context) ->
`process` (HF's `LogitsProcessorList`) -> `choose` (argmax, or softmax + `torch.multinomial`).
`sample_step` (`_step/run/sample_step.py`) is the same in one call.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import torch
from transformers import GenerationConfig, LogitsProcessorList

from hfbridge._step.checks.caller_inputs import extract_logits, keeps_ids_intact
from hfbridge._step.checks.option_checks import (
    TOKEN_ID_OPTIONS,
    check_flag,
    check_token_ids_in_vocab,
    per_row_from_config,
)
from hfbridge._step.checks.step_errors import at_step, processors_stage
from hfbridge._step.plan.build_processors import make_generation_config, processors_for_config
from hfbridge._step.plan.guidance_processor import checked_unconditional
from hfbridge._step.plan.option_docs import fill_options
from hfbridge._step.plan.padded_vocab import tokenizer_size
from hfbridge._step.plan.per_row import PerRowValues, split_per_row
from hfbridge._step.plan.phase_options import check_thinking_options
from hfbridge._step.run.cpu_shortcuts import greedy_choice
from hfbridge._step.run.layout import Layout, LayoutLike, from_rows
from hfbridge._step.run.per_row_draw import Generators, RowState, check_generators
from hfbridge._step.run.phases import Phases, phases_of
from hfbridge._step.run.processor_list import CheckedProcessorList
from hfbridge._step.run.route import Route, decide_route
from hfbridge._step.run.sampler_choice import StepChoice
from hfbridge._step.run.sampler_rows import StepInputs
from hfbridge._step.run.sampler_state import SamplerState, StepResult, first_warper
from hfbridge.processors._cpu_side import owned_scores


class Sampler(StepChoice, SamplerState, StepInputs):
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

    def __init__(
        self,
        generation_config: GenerationConfig | None = None,
        *,
        processors: Iterable[Callable] | None = None,
        layout: LayoutLike = None,
        vocab_size: int | None = None,
        do_sample: bool | None = None,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
        prompt_length: int | None = None,
        attention_mask: torch.Tensor | None = None,
        fast: bool = False,
        prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
        unconditional: Callable[[torch.Tensor], Any] | None = None,
        tokenizer: Any = None,
        thinking_options: Mapping[str, Any] | None = None,
        **generation_kwargs: Any,
    ):
        thinking = check_thinking_options(thinking_options)  # by name, before any work
        # one value per row in a passed config rides the same per-row groups as the keyword
        generation_kwargs = per_row_from_config(generation_config, generation_kwargs)
        generation_kwargs, per_row = split_per_row(generation_kwargs)  # one value per row: `_per_row.py`
        config = make_generation_config(generation_config, do_sample=do_sample, prompt_length=prompt_length,
                                        phased=thinking is not None, **generation_kwargs)
        self._setup(config, processors=processors, layout=layout, vocab_size=vocab_size, generator=generator,
                    prompt_length=prompt_length, attention_mask=attention_mask, fast=fast,
                    prefix_allowed_tokens_fn=prefix_allowed_tokens_fn, unconditional=unconditional,
                    tokenizer=tokenizer, per_row=per_row, thinking_options=thinking,
                    prepare_phase=lambda options: make_generation_config(
                        generation_config, do_sample=options.pop("do_sample", do_sample), prompt_length=prompt_length,
                        phased=True, **{**generation_kwargs, **options}))

    @classmethod
    def from_prepared(cls, generation_config: GenerationConfig, **options: Any) -> Sampler:
        """A Sampler for a config already prepared by `make_generation_config` (HF defaults and
        lengths applied), skipping the second preparation and its warnings; used by `generate`.

        Takes the same keyword arguments as `Sampler` except the generation options.
        """
        sampler = cls.__new__(cls)
        sampler._setup(copy.deepcopy(generation_config), **options)
        return sampler

    def _setup(self, config: GenerationConfig, *, processors: Iterable[Callable] | None = None,
               layout: LayoutLike = None, vocab_size: int | None = None, generator: Generators = None,
               prompt_length: int | None = None, attention_mask: torch.Tensor | None = None,
               fast: bool = False, prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
               unconditional: Callable[[torch.Tensor], Any] | None = None,
               tokenizer: Any = None, per_row: PerRowValues | None = None,
               vocab_from_tokenizer: bool = True, thinking_options: dict[str, Any] | None = None,
               prepare_phase: Callable[[dict[str, Any]], GenerationConfig] | None = None) -> None:
        if vocab_size is not None and (
            not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1
        ):
            raise ValueError(f"`vocab_size` must be a positive int, got {vocab_size!r}.")
        check_flag("fast", fast, optional=False)
        self._setup_generator(generator)
        if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or attention_mask.ndim != 2):
            is_tensor = isinstance(attention_mask, torch.Tensor)
            got = tuple(attention_mask.shape) if is_tensor else type(attention_mask).__name__
            raise ValueError(f"`attention_mask` must be a (batch, seq) tensor, got {got}.")
        self.layout = Layout(layout) if isinstance(layout, str) else layout
        self._layouts: dict[tuple[str | None, int], Layout] = {}  # parsed layouts by (pattern, number of axes)
        self._known_call: tuple | None = None  # `prepare`'s last checked call
        self.vocab_size = vocab_size
        # No `vocab_size`: the columns past the tokenizer's ids are padding (`_step/plan/padded_vocab.py`)
        self._tokenizer_vocab = tokenizer_size(tokenizer) if vocab_size is None and vocab_from_tokenizer else None
        self.prompt_length = prompt_length
        self.fast = bool(fast)
        self._plan = per_row.plan(config) if per_row is not None else None  # may turn do_sample off: all greedy
        if self._plan is not None and len(self._plan.groups) == 1:
            self._plan = None  # every row has the same values: the scalar step, exactly (rows still checked)
        self._rows = RowState(per_row, self._plan)
        self.generation_config = config
        self.do_sample = bool(config.do_sample)
        self._user_processors = processors
        self._prefix_allowed_tokens_fn = prefix_allowed_tokens_fn
        # guidance_scale's logits (`_step/plan/guidance_processor.py`)
        self._unconditional = checked_unconditional(unconditional)
        self._attention_mask = attention_mask
        self._tokenizer = tokenizer  # DRY's string breakers
        # Token ids in the options, checked against the vocabulary once its width is known (first step).
        self._token_options = {name: getattr(config, name, None) for name in TOKEN_ID_OPTIONS}
        self._vocab_checked: int | None = None
        self._device = attention_mask.device if attention_mask is not None else torch.device("cpu")
        self._processors = self._build(self._device)
        self._fast_valid: torch.Tensor | bool | None = None  # [N] bool (or one row's, known): `invalid_rows`
        self._last_fast: tuple[Any, torch.Tensor] | None = None  # (FastDraw, raw rows) for the error
        self._fast_memo: dict[str, Any] = {}  # what the fast path learnt from the last step
        self._batch_rows = 1  # the rows of the last step (`rollback` with one length for every row)
        self._phases: Phases | None = None  # `thinking_options`: a sampler per phase (`_step/run/phases.py`)
        if thinking_options is not None:
            if prepare_phase is None:
                raise ValueError("`thinking_options` needs `prepare_phase` (how the call's options are prepared).")
            self._phases = phases_of(self, config, per_row, thinking_options, prepare_phase)

    def with_generator(self, generator: Generators) -> Sampler:
        """A copy of this sampler drawing from `generator` (one, or one per row); the processors are shared.

        >>> sampler = Sampler(top_k=2, do_sample=True)
        >>> sampler.with_generator(torch.Generator().manual_seed(0)).generator is not None
        True
        """
        if self._phases is not None:
            raise ValueError("`with_generator` cannot give a new generator to a Sampler with `thinking_options` "
                             "(its phases' samplers hold theirs): build a new Sampler with `generator=`.")
        copied = copy.copy(self)
        copied._setup_generator(generator)
        copied._rows = copy.copy(self._rows)
        copied._rows.copies = {}  # a copy per row of a stateful processor belongs to one generator list
        return copied

    def _setup_generator(self, generator: Generators) -> None:
        check_generators(generator)
        self.generator = generator
        self._generator_fits: tuple[Any, torch.device] | None = None  # checked last, see `_check_generator`

    def _build(self, device: torch.device) -> LogitsProcessorList:
        mask = self._attention_mask.to(device) if self._attention_mask is not None else None
        def build(config: GenerationConfig) -> LogitsProcessorList:
            return processors_for_config(config, processors=self._user_processors, prompt_length=self.prompt_length,
                                         attention_mask=mask, device=device,
                                         prefix_allowed_tokens_fn=self._prefix_allowed_tokens_fn,
                                         unconditional=self._unconditional,
                                         rows=lambda output: self.last_rows(extract_logits(output)),
                                         tokenizer=self._tokenizer, generator=self.generator)

        processors = build(self.generation_config)
        if self._plan is not None:  # HF's list per group of rows, merged (`_per_row.RowPlan.build`)
            processors = CheckedProcessorList(self._plan.build(processors, build, device))
        if self.fast and isinstance(self.generator, (list, tuple)):  # each row drawn alone: its own state too
            processors = CheckedProcessorList(self._rows.per_row_copies(list(processors), len(self.generator)))
        self._ids_copied = not keeps_ids_intact(processors)  # see `input_rows`
        # the fast path per group: the places before the first warper run once on the whole batch
        self._head_length = first_warper(processors)
        return processors

    @property
    def phased(self) -> bool:
        """Whether rows take other options while thinking (`thinking_options`)."""
        return self._phases is not None

    @property
    def processors(self) -> LogitsProcessorList:
        """The `LogitsProcessorList` each step runs (HF's classes, HF's order)."""
        return self._processors

    def __repr__(self) -> str:
        if self._phases is not None:
            answering, thinking = self._phases.units[0].samplers
            return f"Sampler(answer: {answering!r}, thinking: {thinking!r})"
        names = ", ".join(type(p).__name__ if not hasattr(p, "__name__") else p.__name__ for p in self._processors)
        mode = "sample" if self.do_sample else "greedy"
        return f"Sampler({mode}{', fast' if self.fast else ''}; [{names}])"

    def __call__(self, logits: Any, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Next tokens for `logits` given the context `input_ids`, shaped as the layout's batch axes."""
        view, ids, batch_shape = self.prepare(logits, input_ids)
        # check=True: a call on its own has no later host read to fold the fast path's flag into
        tokens = self.next_tokens(ids, view, check=True)  # [N]
        return tokens if len(batch_shape) == 1 else from_rows(tokens, batch_shape)

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
             at: int | None = None) -> StepResult:
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

        >>> result = Sampler(top_k=1, do_sample=True).step(None, torch.tensor([[0.0, 3.0, 1.0]]))
        >>> result.tokens.tolist(), result.invalid
        ([1], None)
        """
        processors = self._checked_processors(rows)
        if self._phases is not None:  # each row's phase, its own sampler's step (`_step/run/phases.py`)
            phases = self._phases
            return at_step(at, lambda: phases.step(input_ids, rows))
        if route is None:
            route = self.route(keep_scores=scores is not None)
        if route is Route.ARGMAX:  # HF's argmax straight off the logits: no copy, nothing to process
            tokens, best = greedy(rows)  # [N], [N]: the best score is the validity check too
            return self._greedy_result(tokens, best, rows, None, defer)
        if route is Route.FAST:
            tokens = self._fast_tokens(input_ids, rows, processors) if at is None else \
                processors_stage(at, lambda: self._fast_tokens(input_ids, rows, processors))
            if self._last_fast is None:  # valid, known without a read
                return StepResult(tokens, None, None, None)
            return StepResult(tokens, None, self.invalid_rows, lambda: self.check_rows(True))
        ids = cast(torch.LongTensor, input_ids)
        if scores is None:  # the step's own copy: processors may write into it
            with owned_scores():
                scores = processors(ids, self._float_copy(rows)) if at is None else \
                    processors_stage(at, lambda: processors(ids, self._float_copy(rows)))  # [N, V]
        else:  # the caller keeps this very tensor (HF's raw logits)
            kept = scores
            scores = processors(ids, kept) if at is None else processors_stage(at, lambda: processors(ids, kept))
        processed = scores
        if route is Route.EXACT:  # torch.multinomial reads its input: checked at once
            return StepResult(at_step(at, lambda: self.choose(processed, raw=rows)), scores, None, None)
        tokens, best = greedy(scores)  # [N], [N]
        return self._greedy_result(tokens, best, rows, scores, defer)

    def _checked_processors(self, rows: torch.Tensor) -> LogitsProcessorList:
        """The chain on the rows' device, the token options checked against their vocabulary, their count
        against per-row values and generators."""
        vocab, batch = rows.shape[-1], rows.shape[0]
        if vocab != self._vocab_checked:
            self._check_vocab(vocab)
        processors = self._processors_on(rows.device)
        self._check_rows_per_row(batch)
        self._batch_rows = batch
        return processors

    def _greedy_result(self, tokens: torch.Tensor, best: torch.Tensor, rows: torch.Tensor,
                       scores: torch.Tensor | None, defer: bool) -> StepResult:
        """A greedy step's result: its rows' validity (NaN or -inf best scores) deferred, or checked now."""
        chosen = rows if scores is None else scores
        if not defer:
            self._check_best(best, chosen, rows)
            return StepResult(tokens, scores, None, None)
        return StepResult(tokens, scores, best, lambda: self.explain_invalid(~(best > _NEG_INF), rows, chosen))

    @property
    def _one_generator(self) -> torch.Generator | None:
        return self.generator if isinstance(self.generator, torch.Generator) else None  # a list is drawn per row

    def _check_rows_per_row(self, rows: int) -> None:
        self._rows.check(rows, self.generator)

    def _processors_on(self, device: torch.device) -> LogitsProcessorList:
        if device != self._device:
            self._device = device
            self._processors = self._build(device)
        return self._processors

    def process(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Run the processors (HF's order) on `(rows, vocab)` float32 scores, which HF's processors may modify.

        hfbridge's own processors leave `scores` as they are here, as in transformers' loop, which keeps that
        very tensor as the step's raw logits; they write in place only into the step's private copy
        (`next_tokens`).
        """
        if scores.shape[-1] != self._vocab_checked:
            self._check_vocab(scores.shape[-1])
        self._check_rows_per_row(scores.shape[0])
        self._batch_rows = scores.shape[0]
        if self._phases is not None:
            raise ValueError("a Sampler with `thinking_options` chooses each row with its phase's processors: "
                             "call `step` or `next_tokens`, not `process`.")
        return self._processors_on(scores.device)(cast(torch.LongTensor, input_ids), scores)  # [N, V]

    def _check_vocab(self, vocab: int) -> None:
        """Token ids in the options must lie in `[0, vocab)`; callers skip it for the width checked last."""
        check_token_ids_in_vocab(self._token_options, vocab)
        self._vocab_checked = vocab


Sampler.__doc__ = fill_options(Sampler.__doc__)  # the registry's options, listed in help()


_NEG_INF = float("-inf")
