"""What a `Sampler` is built from, and how it reads a step's inputs: `SamplerSetup`, which `Sampler` extends with the
step (`_step/run/sampler.py`).

The options from every source resolved once (`sampler_chain.resolve_options`), the chain built for a device
(`sampler_chain.build_chain`), the caller's rows read through `sampler_rows.StepInputs` (layout, vocabulary, the
token ids in the options), the generator checked against the logits' device, and the phases of
`thinking_options`. Nothing here chooses a token.

>>> import torch
>>> from hfbridge._step.run.sampler import Sampler
>>> view, ids, batch = Sampler(vocab_size=2).prepare(torch.zeros(1, 4, 3), torch.tensor([[0, 1, 1, 0]]))
>>> tuple(view.shape), tuple(ids.shape), batch
((1, 2), (1, 4), (1,))
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from transformers import GenerationConfig, LogitsProcessorList

from hfbridge._step.checks.caller_inputs import extract_logits, keeps_ids_intact
from hfbridge._step.checks.option_checks import TOKEN_ID_OPTIONS
from hfbridge._step.plan.guidance_processor import checked_unconditional
from hfbridge._step.plan.padded_vocab import tokenizer_size
from hfbridge._step.plan.per_row import PerRowValues
from hfbridge._step.run import sampler_choice as choice
from hfbridge._step.run.layout import Layout, LayoutLike
from hfbridge._step.run.per_row_draw import Generators, RowState, check_generators
from hfbridge._step.run.phases import Phases, phases_of
from hfbridge._step.run.sampler_chain import ChainInputs, build_chain, check_arguments, first_warper, resolve_options
from hfbridge._step.run.sampler_rows import StepInputs

__all__ = ["SamplerSetup"]

_S = TypeVar("_S", bound="SamplerSetup")


class SamplerSetup:
    """A `Sampler` built (its options, chain, inputs and generator); `Sampler` documents the arguments."""

    def __init__(self, generation_config: GenerationConfig | None = None, *,
                 processors: Iterable[Callable] | None = None, layout: LayoutLike = None,
                 vocab_size: int | None = None, do_sample: bool | None = None,
                 generator: torch.Generator | Sequence[torch.Generator] | None = None,
                 prompt_length: int | None = None, attention_mask: torch.Tensor | None = None, fast: bool = False,
                 prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
                 unconditional: Callable[[torch.Tensor], Any] | None = None, tokenizer: Any = None,
                 thinking_options: Mapping[str, Any] | None = None, **generation_kwargs: Any):
        # the options from every source, checked and prepared once (`sampler_chain.resolve_options`)
        config, per_row, thinking, prepare_phase = resolve_options(generation_config, do_sample, prompt_length,
                                                                   thinking_options, generation_kwargs)
        self._setup(config, processors=processors, layout=layout, vocab_size=vocab_size, generator=generator,
                    prompt_length=prompt_length, attention_mask=attention_mask, fast=fast,
                    prefix_allowed_tokens_fn=prefix_allowed_tokens_fn, unconditional=unconditional,
                    tokenizer=tokenizer, per_row=per_row, thinking_options=thinking, prepare_phase=prepare_phase)

    @classmethod
    def from_prepared(cls: type[_S], generation_config: GenerationConfig, **options: Any) -> _S:
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
        check_arguments(vocab_size, fast, attention_mask)
        self._setup_generator(generator)
        # the caller's rows: the layout, the vocabulary (no `vocab_size`: columns past the tokenizer's ids are
        # padding, `_step/plan/padded_vocab.py`), the token ids in the options checked against its width
        self._inputs = StepInputs(Layout(layout) if isinstance(layout, str) else layout, vocab_size,
                                  tokenizer_size(tokenizer) if vocab_size is None and vocab_from_tokenizer else None,
                                  {name: getattr(config, name, None) for name in TOKEN_ID_OPTIONS})
        self.prompt_length, self.fast = prompt_length, bool(fast)
        plan = per_row.plan(config) if per_row is not None else None  # may turn do_sample off: all greedy
        # every row with the same values: the scalar step, exactly (rows still checked)
        self._rows = RowState(per_row, plan if plan is not None and len(plan.groups) > 1 else None)
        self.generation_config, self.do_sample = config, bool(config.do_sample)
        self._user_processors, self._prefix_allowed_tokens_fn = processors, prefix_allowed_tokens_fn
        # guidance_scale's logits
        self._unconditional = checked_unconditional(unconditional) if unconditional is not None else None
        self._tokenizer = tokenizer  # DRY's string breakers
        self._chain = ChainInputs(processors, prompt_length, attention_mask, prefix_allowed_tokens_fn,
                                  self._unconditional, tokenizer)
        self._device = attention_mask.device if attention_mask is not None else torch.device("cpu")
        self._processors = self._build(self._device)
        self._flags = choice.FastFlags()  # the last fast step's rows with nothing to choose: `invalid_rows`
        self._fast_memo: dict[str, Any] = {}  # what the fast path learnt from the last step
        self._batch_rows = 1  # the rows of the last step (`rollback` with one length for every row)
        self._phases: Phases | None = None  # `thinking_options`: a sampler per phase (`_step/run/phases.py`)
        if thinking_options is not None:
            if prepare_phase is None:
                raise ValueError("`thinking_options` needs `prepare_phase` (how the call's options are prepared).")
            self._phases = phases_of(self, config, per_row, thinking_options, prepare_phase)

    def with_generator(self: _S, generator: Generators) -> _S:
        """A copy of this sampler drawing from `generator` (one, or one per row); the processors are shared.

        >>> from hfbridge import Sampler
        >>> sampler = Sampler(top_k=2, do_sample=True)
        >>> sampler.with_generator(torch.Generator().manual_seed(0)).generator is not None
        True
        """
        if self._phases is not None:
            raise ValueError("`with_generator` cannot give a new generator to a Sampler with `thinking_options` "
                             "(its phases' samplers hold theirs): build a new Sampler with `generator=`.")
        copied = copy.copy(self)
        copied._setup_generator(generator)
        copied._inputs = copy.copy(self._inputs)  # its own layout and last call
        copied._rows = copy.copy(self._rows)
        copied._rows.copies = {}  # a copy per row of a stateful processor belongs to one generator list
        return copied

    def _setup_generator(self, generator: Generators) -> None:
        check_generators(generator)
        self.generator = generator
        self._generator_fits: tuple[Any, torch.device] | None = None  # checked last, see `_check_generator`

    def _check_generator(self, device: torch.device) -> None:
        """The generator (or each of a list) on the logits' device; checked once per generator and device."""
        fits = self._generator_fits
        if self.generator is None or (fits is not None and fits[0] is self.generator and fits[1] == device):
            return  # checked at the last step (twice a step in exact sampling: `prepare` and `choose`)
        choice.check_generator(self.generator, device)
        self._generator_fits = (self.generator, device)

    def _build(self, device: torch.device) -> LogitsProcessorList:
        processors = build_chain(self.generation_config, self._chain, device=device, generator=self.generator,
                                 row_state=self._rows, fast=self.fast,
                                 rows=lambda output: self.last_rows(extract_logits(output)))
        self._inputs.ids_copied = not keeps_ids_intact(processors)  # see `input_rows`
        # the fast path per group: the places before the first warper run once on the whole batch
        self._head_length = first_warper(processors)
        return processors

    layout = property(lambda self: self._inputs.layout, lambda self, value: setattr(self._inputs, "layout", value),
                      doc="The logits' layout: a `Layout`, a pattern, or None (the default for their number of axes).")

    vocab_size = property(lambda self: self._inputs.vocab_size, doc="The real vocabulary (`vocab_size=`), or None.")

    _known_call = property(lambda self: self._inputs.known_call)  # `prepare`'s last checked call

    _last_fast = property(lambda self: self._flags.last)  # the last fast draw and its rows, for the error

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

    def prepare(self, logits: Any, input_ids: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
        """Check a step's arguments and flatten them: `(rows, ids, batch_shape)`: the last-position `(rows, vocab)`
        view of the logits (read it, never write it), `(rows, seq)` int64 ids, the layout's batch axes."""
        return self._inputs.prepare(logits, input_ids, check_generator=self._check_generator)

    def layout_of(self, logits: torch.Tensor) -> Layout:
        """The sampler's layout, or the default one for `logits.ndim`."""
        return self._inputs.layout_of(logits)

    def last_rows(self, logits: torch.Tensor) -> torch.Tensor:
        """The last-position `(rows, vocab)` logits, padded vocabulary dropped: a view, no copy."""
        return self._inputs.last_rows(logits)

    def vocab_limit(self, columns: int) -> int | None:
        """How many of `columns` vocabulary columns a step keeps (None: all), `vocab_size` or the tokenizer's size."""
        return self._inputs.vocab_limit(columns)

    def input_rows(self, input_ids: torch.Tensor | None, rows: torch.Tensor | int,
                   *, batch_shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """`input_ids` as `(rows, seq)` int64 (a private copy where a processor could write them), checked against
        the `(rows, vocab)` logits rows (or just their number); `batch_shape`: the logits' batch shape."""
        return self._inputs.input_rows(input_ids, rows, batch_shape=batch_shape, device=self._device)

    def _checked_processors(self, rows: torch.Tensor) -> Any:
        """The chain on the rows' device, the token options checked against their vocabulary, their count
        against per-row values and generators."""
        self._inputs.check_vocab(rows.shape[-1])
        processors = self._processors_on(rows.device)
        self._rows.check(rows.shape[0], self.generator)
        self._batch_rows = rows.shape[0]
        return processors

    def _processors_on(self, device: torch.device) -> Any:
        if device != self._device:
            self._device = device
            self._processors = self._build(device)
        return self._processors
