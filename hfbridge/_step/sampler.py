"""One decoding step: logits of any layout in, next tokens out, exactly as HF's `generate` picks them.

The stages, in order (names follow gpt-fast's one-verb-per-stage habit):
`rows` (extract, layout, vocab trim, float32 copy) -> `input_rows` (validate the context) ->
`process` (HF's `LogitsProcessorList`) -> `choose` (argmax, or softmax + `torch.multinomial`).
`sample_step` (`_step/sample_step.py`) is the same in one call.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import torch
from transformers import GenerationConfig, LogitsProcessorList

from hfbridge._step.build_processors import make_generation_config, processors_for_config
from hfbridge._step.caller_inputs import extract_logits, keeps_ids_intact
from hfbridge._step.fast.fast_path import fast_draw
from hfbridge._step.guidance_processor import checked_unconditional
from hfbridge._step.layout import Layout, LayoutLike, from_rows
from hfbridge._step.option_checks import TOKEN_ID_OPTIONS, check_flag, check_option_values, check_token_ids_in_vocab
from hfbridge._step.option_docs import fill_options
from hfbridge._step.option_table import per_row_options
from hfbridge._step.padded_vocab import tokenizer_size
from hfbridge._step.per_row import PerRowValues, split_per_row
from hfbridge._step.per_row_draw import Generators, RowState, check_generators, fast_rows
from hfbridge._step.processor_list import CheckedProcessorList
from hfbridge._step.sampler_choice import StepChoice
from hfbridge._step.sampler_rows import StepInputs
from hfbridge._step.sampler_state import SamplerState, first_warper, replayed
from hfbridge.processors._host import owned_scores


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
        **generation_kwargs: Any,
    ):
        for name in per_row_options():  # one value per row in a passed config rides the same per-row groups
            value = getattr(generation_config, name, None) if generation_config is not None else None
            if name not in generation_kwargs and (isinstance(value, (list, tuple)) or bool(getattr(value, "ndim", 0))):
                check_option_values({name: value}, where="in `generation_config`")
                generation_kwargs[name] = value
        generation_kwargs, per_row = split_per_row(generation_kwargs)  # one value per row: `_per_row.py`
        config = make_generation_config(
            generation_config, do_sample=do_sample, prompt_length=prompt_length, **generation_kwargs
        )
        self._setup(config, processors=processors, layout=layout, vocab_size=vocab_size, generator=generator,
                    prompt_length=prompt_length, attention_mask=attention_mask, fast=fast,
                    prefix_allowed_tokens_fn=prefix_allowed_tokens_fn, unconditional=unconditional,
                    tokenizer=tokenizer, per_row=per_row)

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
               vocab_from_tokenizer: bool = True) -> None:
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
        # No `vocab_size`: the columns past the tokenizer's ids are padding (`_step/padded_vocab.py`)
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
        # guidance_scale's logits (`_step/guidance_processor.py`)
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

    def with_generator(self, generator: Generators) -> Sampler:
        """A copy of this sampler drawing from `generator` (one, or one per row); the processors are shared.

        >>> sampler = Sampler(top_k=2, do_sample=True)
        >>> sampler.with_generator(torch.Generator().manual_seed(0)).generator is not None
        True
        """
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
    def processors(self) -> LogitsProcessorList:
        """The `LogitsProcessorList` each step runs (HF's classes, HF's order)."""
        return self._processors

    def __repr__(self) -> str:
        names = ", ".join(type(p).__name__ if not hasattr(p, "__name__") else p.__name__ for p in self._processors)
        mode = "sample" if self.do_sample else "greedy"
        return f"Sampler({mode}{', fast' if self.fast else ''}; [{names}])"

    def __call__(self, logits: Any, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Next tokens for `logits` given the context `input_ids`, shaped as the layout's batch axes."""
        view, ids, batch_shape = self.prepare(logits, input_ids)
        # check=True: a call on its own has no later host read to fold the fast path's flag into
        tokens = self.next_tokens(ids, view, check=True)  # [N]
        return tokens if len(batch_shape) == 1 else from_rows(tokens, batch_shape)

    def next_tokens(self, input_ids: torch.Tensor, rows: torch.Tensor, *,
                    check: bool | None = None) -> torch.Tensor:
        """`(rows,)` next tokens from `(rows, vocab)` logits and `(rows, seq)` ids (see `input_rows`).

        `rows` is read, never modified (processors run on a float32 copy). Uses the fused path
        when the sampler is `fast` and sampling; exact mode raises at once for a row with nothing
        to choose.

        Args:
            check: Fast path only: read `invalid_rows` now and raise exact mode's error for a row
                that could not be sampled (`check_rows`). Default None: at once on CPU (free);
                on an accelerator, not here: call `check_rows()` where you read the device anyway.
        """
        shape, device = rows.shape, rows.device
        if shape[-1] != self._vocab_checked:
            self._check_vocab(shape[-1])
        processors = self._processors_on(device)
        self._check_rows_per_row(shape[0])
        self._batch_rows = shape[0]
        if self.fast and self.do_sample:
            # float32 rows are lent read-only: the fast path copies where it writes (a temperature's
            # division makes the copy), instead of a copy here and a division in place there
            lent = rows.dtype == torch.float32
            result: Any
            if self._plan is not None or isinstance(self.generator, (list, tuple)):  # per group, or per row
                result = self._fast_rows(input_ids, rows, processors, lent)
            else:
                result = fast_draw(input_ids, rows if lent else self._float_copy(rows), processors, self._one_generator,
                                   memo=self._fast_memo, read_only=lent)
            known = result.known_valid  # the one-row CPU draw knows it on the host
            if known:  # valid, known without a read: nothing to keep for an error
                self._fast_valid, self._last_fast = True, None
                return result.tokens
            self._fast_valid = known if known is not None else result.valid  # no sync
            self._last_fast = (result, rows)
            if check or (check is None and device.type == "cpu"):
                self.check_rows()
            return result.tokens
        if not processors and not self.do_sample:
            return self.choose(rows)  # plain argmax reads the logits without copying them
        # `process` without its checks, made above; the copy is the step's own: processors may write into it
        with owned_scores():
            scores = processors(cast(torch.LongTensor, input_ids), self._float_copy(rows))
        return self.choose(scores, raw=rows)

    def _fast_rows(self, input_ids: torch.Tensor, rows: torch.Tensor, processors: LogitsProcessorList, lent: bool,
                   head_output: torch.Tensor | None = None, replays: dict[int, torch.Tensor] | None = None) -> Any:
        """The fast path per group (or per row): the chain's places before its first warper run once on the
        whole batch (guidance, penalties, your processors: exactly as exact mode runs them), then each
        group's own warpers, fused, on its rows alone (`per_row_draw.fast_rows`). `head_output`: those
        places' output when already computed; `replays`: outputs to hand back instead of running a processor
        again (by the processor's place in the chain), for `explain`."""
        start = self._head_length
        if head_output is not None:
            scores, lent = head_output, False
        elif start:
            head = CheckedProcessorList(processors[:start])
            scores, lent = head(cast(torch.LongTensor, input_ids), self._float_copy(rows)), False  # [N, V]
        else:
            scores = rows
        units = self._rows.units(processors, self.generator, rows.shape[0], rows.device, start)
        if replays:
            for (_, original), (copied, _) in self._rows.copies.items():
                if original in replays and id(copied) not in replays:
                    replays[id(copied)] = replays[original]
            units = [(index, row_list, LogitsProcessorList(replayed(own, replays, index, start, processors)),
                      samples, generator, memo) for index, row_list, own, samples, generator, memo in units]
        return fast_rows(input_ids, scores, units, read_only=lent)

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

    def _check_generator(self, device: torch.device) -> None:
        fits = self._generator_fits
        if self.generator is None or (fits is not None and fits[0] is self.generator and fits[1] == device):
            return  # checked at the last step (twice a step in exact sampling: `prepare` and `choose`)
        for index, generator in enumerate(self.generator if isinstance(self.generator, (list, tuple))
                                          else [self.generator]):
            generator_device = torch.device(generator.device)
            if generator_device.type != device.type or (
                device.type != "cpu" and (generator_device.index or 0) != (device.index or 0)
            ):
                name = "generator" if isinstance(self.generator, torch.Generator) else f"generator[{index}]"
                raise ValueError(
                    f"`{name}` is on {generator_device} but the logits are on {device}; "
                    f"create it with torch.Generator(device={str(device)!r})."
                )
        self._generator_fits = (self.generator, device)

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
        return self._processors_on(scores.device)(cast(torch.LongTensor, input_ids), scores)  # [N, V]

    def _check_vocab(self, vocab: int) -> None:
        """Token ids in the options must lie in `[0, vocab)`; callers skip it for the width checked last."""
        check_token_ids_in_vocab(self._token_options, vocab)
        self._vocab_checked = vocab


Sampler.__doc__ = fill_options(Sampler.__doc__)  # the registry's options, listed in help()
