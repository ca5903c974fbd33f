"""Assisted (speculative) and prompt-lookup decoding: HF's own `_assisted_decoding`, run on adapters.

HF's loop asks its model for very little: `prepare_inputs_for_generation`, a forward call whose
output has `.logits` for every fed position and a `.past_key_values` it can `crop`, and
`_update_model_kwargs_for_generation`. `_TargetHost` answers those with the target's adapter, so
the installed transformers' loop, candidate generators, speculative sampling and candidate-length
schedules run unchanged: the result is HF's by construction, on every supported version.

HF's `AssistedCandidateGenerator` drafts by calling `assistant_model.generate(...)` and carrying
its `past_key_values` from one call to the next. `_AssistantHost` is that assistant: its `generate`
is hfbridge's own loop (`_prepare` + `_decode`, which equals HF's `_sample`) on the draft's adapter,
resumed from the state the previous call left, so that the draft can be any model form too.

Rolling back rejected drafts goes through `ModelAdapter.crop` (see `_cache.crop_cache`).
"""

from __future__ import annotations

import inspect
from typing import Any, cast

import torch
from einops import rearrange
from transformers import GenerationConfig, LogitsProcessorList, PretrainedConfig
from transformers.cache_utils import DynamicCache
from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerationMixin
from transformers.modeling_outputs import CausalLMOutputWithPast

from ._generate import _add_note, _decode, _prepare, _progress_bar
from ._hf import _TRANSFORMERS_MAJOR, ProcessorHost
from ._layout import Layout
from ._models import AdapterTypeError, InputPos, ModelAdapter, Recompute, as_adapter
from ._step import extract_logits

# Options of HF's assisted decoding that are fields of the assistant's own generation config in HF.
ASSISTANT_OPTIONS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


class _Runner:
    """One model behind HF's loop: its adapter, its state and how many positions it has seen."""

    def __init__(self, adapter: ModelAdapter, state: dict[str, Any], *, layout: Layout | str | None,
                 vocab_size: int | None, role: str):
        self.adapter, self.state = adapter, state
        self.layout, self.vocab_size, self.role = layout, vocab_size, role
        self.cached = 0  # positions the model holds (fed and not cropped)
        self.vocab: int | None = None  # logits width, known after the first call
        self.calls = 0

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Call the model on the positions it has not seen; their float32 logits `(batch, fed, vocab)`."""
        fed = input_ids.shape[1] - self.cached
        self.state["attention_mask"] = attention_mask
        try:
            outputs = self.adapter.forward(input_ids, self.state)
            self.state = self.adapter.update(outputs, input_ids, self.state)
        except AdapterTypeError as error:
            raise TypeError(f"generate(): the {self.role} model, call {self.calls}: {error}") from None
        except Exception as error:
            _add_note(error, f"hfbridge.generate: raised by the {self.role} model in its call {self.calls} "
                             f"({input_ids.shape[1]} tokens, {fed} of them fed).")
            raise
        if self.calls == 0:
            self.adapter.check_crop(self.state)
        self.calls += 1
        self.cached = input_ids.shape[1]
        logits = self.positions(outputs, input_ids.shape[0], fed)
        return logits.float() if logits.dtype != torch.float32 else logits

    def positions(self, outputs: Any, batch: int, fed: int) -> torch.Tensor:
        """The last `fed` positions of the model's logits as `(batch, fed, vocab)`, checked."""
        logits = extract_logits(self.adapter.logits(outputs))
        layout = Layout.for_tensor(logits, self.layout)
        layout.check(logits)
        where = (f"generate(): the {self.role} model returned logits of shape {tuple(logits.shape)} "
                 f"(layout {layout.pattern!r})")
        if not layout.has_seq or len(layout.batch_axes) != 1:
            raise ValueError(
                f"{where}; assisted and prompt-lookup decoding check several tokens in one call, so they need one "
                "batch axis and a sequence axis, e.g. 'b t v'."
            )
        full = rearrange(logits, f"{layout.pattern} -> {layout.batch_axes[0]} t v")  # [B, T, V]
        if full.shape[0] != batch or full.shape[1] < fed:
            raise ValueError(
                f"{where}, expected {batch} row(s) and the logits of all {fed} positions fed in this call: "
                "assisted and prompt-lookup decoding check several draft tokens at once (do not keep only "
                "the last position, e.g. no logits_to_keep=1)."
            )
        full = full[:, full.shape[1] - fed:]
        if self.vocab_size is not None:
            if full.shape[-1] < self.vocab_size:
                raise ValueError(f"{where}, fewer vocabulary columns than `vocab_size`={self.vocab_size}.")
            full = full[..., : self.vocab_size]
        if self.vocab is None:
            self.vocab = full.shape[-1]
        elif full.shape[-1] != self.vocab:
            raise ValueError(f"{where}, but {self.vocab} vocabulary columns before; the vocabulary must stay the same.")
        if bool(torch.isnan(full).any()):
            raise ValueError(f"{where}, which contain NaN; check the model's forward pass (overflow in fp16?).")
        return full

    def crop(self, length: int) -> None:
        """Forget every position from `length` on."""
        if length < self.cached:
            self.state = self.adapter.crop(self.state, length)
            self.cached = length


class _AdapterCache(DynamicCache):
    """An adapter's cache as HF's loops see it: its length and `crop`, delegated to the adapter.

    HF's code only measures (`get_seq_length`) and crops it; on transformers 4.x through
    `isinstance(cache, DynamicCache)` checks, hence the base class (whose storage stays unused).
    """

    def __init__(self, runner: _Runner):
        super().__init__()
        self.runner = runner

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        return self.runner.cached

    def activate_past_recording(self) -> None:
        """transformers 5 asks caches to keep sliding-window states for rollback; the adapter's crop decides."""

    def crop(self, amount: int) -> None:
        if _TRANSFORMERS_MAJOR >= 5:  # crop(tokens_to_remove <= 0)
            length = self.runner.cached + amount
        else:  # crop(max_length), or crop(-tokens_to_remove)
            length = amount if amount >= 0 else self.runner.cached + amount
        self.runner.crop(max(length, 0))


def _fresh_config() -> PretrainedConfig:
    config = PretrainedConfig()
    config.is_encoder_decoder = False
    return config


class _TargetHost(ProcessorHost):
    """The target model as HF's `_assisted_decoding` sees it."""

    def __init__(self, runner: _Runner, device: torch.device, model_inputs: dict[str, Any]):
        super().__init__(device=device)
        self.config = _fresh_config()  # a private one: the lookup generator reads `vocab_size` from it
        self.runner = runner
        self.cache = _AdapterCache(runner)
        self.model_inputs = model_inputs
        self.lookup: Any = None  # HF's prompt-lookup generator, when that is the strategy
        self.assistant: Any = None  # the `_AssistantHost`, when a draft model is the strategy
        self.do_sample = False

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, *args: Any, **kwargs: Any) -> dict[str, Any]:
        # The adapter decides what the model is fed (all of it, or the tokens after its cache).
        return {"input_ids": input_ids, "attention_mask": kwargs.get("attention_mask")}

    def __call__(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                 **kwargs: Any) -> CausalLMOutputWithPast:
        if attention_mask is None:
            attention_mask = input_ids.new_ones(input_ids.shape)
        logits = self.runner.forward(input_ids, attention_mask)  # [1, fed, V]
        draft_vocab = getattr(self.assistant, "vocab", None)
        if self.do_sample and draft_vocab is not None and draft_vocab != self.runner.vocab:
            raise ValueError(
                f"generate(): the assistant's logits have {draft_vocab} vocabulary columns and the target's "
                f"{self.runner.vocab}; speculative sampling compares their distributions token by token, so both "
                "must cover the same vocabulary (pass vocab_size= to drop padded columns)."
            )
        if self.lookup is not None:
            self.lookup.vocab_size = self.runner.vocab
        return CausalLMOutputWithPast(logits=logits, past_key_values=self.cache)

    def _update_model_kwargs_for_generation(self, outputs: Any, model_kwargs: dict[str, Any],
                                            is_encoder_decoder: bool = False, num_new_tokens: int = 1,
                                            **kwargs: Any) -> dict[str, Any]:
        # As HF's: one more mask column (the loop resizes the mask to each candidate length anyway).
        mask = model_kwargs.get("attention_mask")
        if mask is not None:
            model_kwargs["attention_mask"] = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        model_kwargs["past_key_values"] = outputs.past_key_values
        if model_kwargs.get("cache_position") is not None:
            model_kwargs["cache_position"] = model_kwargs["cache_position"][-1:] + num_new_tokens
        return model_kwargs

    def _get_candidate_generator(self, *args: Any, **kwargs: Any) -> Any:
        generator: Any = GenerationMixin._get_candidate_generator(cast(Any, self), *args, **kwargs)  # HF's choice
        if hasattr(generator, "num_output_tokens"):  # prompt lookup
            self.lookup = generator
            if getattr(generator, "eos_token_id", 0) is None:
                # transformers 4.x's lookup fails on `isin(ids, None)`; no eos id matches nothing
                generator.eos_token_id = torch.empty(0, dtype=torch.long, device=self.device)
            if self.runner.vocab is not None:
                generator.vocab_size = self.runner.vocab
        return generator


class _AssistantHost:
    """The draft model as HF's `AssistedCandidateGenerator` sees it: a `generate` that is hfbridge's."""

    def __init__(self, adapter: ModelAdapter, *, device: torch.device, generation_config: GenerationConfig,
                 layout: Any, vocab_size: int | None):
        self.adapter = adapter
        self.device = device
        self.generation_config = generation_config  # HF reads the draft length and schedule from here
        self.config = _fresh_config()
        self.layout, self.vocab_size = layout, vocab_size
        self.vocab: int | None = None  # logits width, once it has drafted

    def _supports_logits_to_keep(self) -> bool:
        return False

    def _supports_num_logits_to_keep(self) -> bool:
        return False

    def generate(self, input_ids: torch.LongTensor, *, generation_config: GenerationConfig,
                 logits_processor: Any = None, min_new_tokens: int | None = None, max_new_tokens: int | None = None,
                 attention_mask: torch.Tensor | None = None, past_key_values: Any = None,
                 use_cache: Any = None, **model_inputs: Any) -> GenerateDecoderOnlyOutput:
        options: dict[str, Any] = {"max_new_tokens": max_new_tokens, **model_inputs}
        if min_new_tokens:
            options["min_new_tokens"] = min_new_tokens
        call = _prepare(self.adapter, input_ids, attention_mask=attention_mask, generation_config=generation_config,
                        processors=LogitsProcessorList(logits_processor or []), stopping_criteria=None,
                        streamer=None, tokenizer=None, layout=self.layout, vocab_size=self.vocab_size,
                        generator=None, fast=False, kwargs=options)
        if isinstance(past_key_values, _AdapterCache):  # resume where the last draft stopped (HF cropped it)
            runner = past_key_values.runner
            call.state = runner.state
        else:
            runner = _Runner(self.adapter, call.state, layout=self.layout, vocab_size=self.vocab_size,
                             role="assistant")
        try:
            _decode(self.adapter, call, None, None)
        except Exception as error:
            _add_note(error, f"hfbridge.generate: raised while the assistant model drafted after "
                             f"{input_ids.shape[1]} tokens.")
            raise
        if call.scores:
            self.vocab = call.scores[0].shape[-1]
        runner.state = call.state
        runner.cached = call.sequences.shape[1] - 1  # the last drafted token was never fed
        return GenerateDecoderOnlyOutput(sequences=cast(torch.LongTensor, call.sequences), scores=call.scores,
                                         logits=None, attentions=None, hidden_states=None,
                                         past_key_values=_AdapterCache(runner))


def generate_assisted(adapter: ModelAdapter, call: Any, *, assistant_model: Any, processors: Any, streamer: Any,
                      layout: Any, vocab_size: int | None, generator: Any, fast: bool, progress: bool) -> Any:
    """`generate` for assisted and prompt-lookup decoding, from the prepared call to the result."""
    model_inputs = adapter.model_inputs(call.state)
    try:
        assistant = None if assistant_model is None else as_adapter(assistant_model)
    except TypeError as error:
        raise TypeError(f"`assistant_model`: {error}") from None
    _check(adapter, assistant, call.config, batch=call.sequences.shape[0], generator=generator, fast=fast,
           model_inputs=model_inputs)
    if streamer is not None:
        streamer.put(call.sequences.cpu())  # the prompt first, as HF; HF's loop sends the rest and ends it
    bar = _progress_bar(progress, max((call.config.max_length or 0) - call.sequences.shape[1], 0))
    if bar is not None:
        streamer = _ProgressStreamer(streamer, bar)
    try:
        result, runner = assisted_decode(
            adapter, sequences=call.sequences, mask=call.mask, state=call.state, config=call.config,
            processors=call.sampler.processors, user_processors=LogitsProcessorList(processors or []),
            criteria=call.criteria, streamer=streamer, assistant=assistant, model_inputs=model_inputs,
            layout=layout, vocab_size=vocab_size)
    except BaseException:
        if streamer is not None:
            streamer.end()
        raise
    finally:
        if bar is not None:
            bar.close()
    if isinstance(result, GenerateDecoderOnlyOutput):
        result.past_key_values = adapter.cache(runner.state)
    return result


class _ProgressStreamer:
    """Counts the tokens HF's loop streams (several per call) on a progress bar, and passes them on."""

    def __init__(self, streamer: Any, bar: Any):
        self.streamer, self.bar = streamer, bar

    def put(self, value: torch.Tensor) -> None:
        self.bar.update(value.shape[-1])
        if self.streamer is not None:
            self.streamer.put(value)

    def end(self) -> None:
        if self.streamer is not None:
            self.streamer.end()


def _check(adapter: ModelAdapter, assistant: ModelAdapter | None, config: GenerationConfig, *, batch: int,
           generator: Any, fast: bool, model_inputs: dict[str, Any]) -> None:
    """Refuse, before any model call, what assisted / prompt-lookup decoding cannot do here."""
    what = "assisted decoding" if config.prompt_lookup_num_tokens is None else "prompt-lookup decoding"
    _check_options(config, assistant is not None)
    if batch != 1:
        raise ValueError(
            f"{what} takes one sequence (batch size 1, as HF's), got {batch} (prompts x num_return_sequences); "
            "call generate once per prompt."
        )
    for role, model in (("model", adapter), ("assistant_model", assistant)):
        if model is None:
            continue
        if type(model).crop is ModelAdapter.crop:
            try:
                model.crop({}, 0)
            except TypeError as error:
                raise TypeError(f"`{role}`: {error}") from None
        if role == "assistant_model" and isinstance(model, InputPos) and isinstance(adapter, InputPos) \
                and model.model is adapter.model:
            raise ValueError(
                "`assistant_model` and `model` are the same InputPos model, whose one cache inside would hold both "
                "the draft's and the target's positions; give the draft its own model object (and caches)."
            )
        if role == "model" and isinstance(model, Recompute) and model.max_context is not None:
            raise ValueError(
                f"{what} checks several tokens in one call, which a model that sees only its last "
                f"max_context={model.max_context} tokens would score with less context than one token at a time; "
                "drop max_context for the target model (the assistant may keep it)."
            )
    if assistant is not None:
        try:
            assistant.check_inputs(list(model_inputs))
        except TypeError as error:
            raise TypeError(f"`assistant_model`: {error} (as in HF, the assistant receives the model inputs "
                            "given to generate)") from None
    if generator is not None and config.do_sample:
        raise ValueError(
            f"{what} samples from the global RNG inside HF's loop (seed it with torch.manual_seed); "
            "`generator=` is not supported here."
        )
    if fast:
        raise ValueError(f"`fast=True` is the one-token sampling path; {what} runs HF's own loop. Drop fast=True.")
    for name, why in (("assistant_early_exit", "drafts with the target model's own early layers"),
                      ("use_mtp", "drafts with the target model's multi-token-prediction heads"),
                      ("speculation_type", "drafts with the target model's embeddings")):
        value = getattr(config, name, None)
        if value not in (None, False):
            raise ValueError(f"generate() does not support `{name}`={value!r}: it {why}, which hfbridge cannot see.")


_SCHEDULES = ("constant", "heuristic", "heuristic_transient")


def _check_options(config: GenerationConfig, has_assistant: bool) -> None:
    """The draft options HF takes without checking them, checked with a message naming the option."""
    def is_number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    lookup = config.prompt_lookup_num_tokens
    if lookup is not None and has_assistant:
        raise ValueError(
            f"`prompt_lookup_num_tokens`={lookup} and `assistant_model` were both given; HF would draft from the "
            "prompt and ignore the assistant. Pass one of them."
        )
    checks = (
        ("prompt_lookup_num_tokens", lookup, lookup is None or (isinstance(lookup, int) and not isinstance(lookup, bool)
                                                               and lookup >= 1), "an int >= 1"),
        ("max_matching_ngram_size", config.max_matching_ngram_size,
         config.max_matching_ngram_size is None or (isinstance(config.max_matching_ngram_size, int)
                                                    and not isinstance(config.max_matching_ngram_size, bool)
                                                    and config.max_matching_ngram_size >= 1), "an int >= 1"),
        ("num_assistant_tokens", config.num_assistant_tokens,
         config.num_assistant_tokens is None or (is_number(config.num_assistant_tokens)
                                                 and config.num_assistant_tokens >= 1), "a number >= 1"),
        ("num_assistant_tokens_schedule", config.num_assistant_tokens_schedule,
         config.num_assistant_tokens_schedule in (None,) + _SCHEDULES, f"one of {list(_SCHEDULES)}"),
        ("assistant_confidence_threshold", config.assistant_confidence_threshold,
         config.assistant_confidence_threshold is None or (is_number(config.assistant_confidence_threshold)
                                                           and 0 <= config.assistant_confidence_threshold <= 1),
         "a number in [0, 1] (0 turns the early stop off)"),
    )
    for name, value, valid, expected in checks:
        if not valid:
            raise ValueError(f"`{name}` must be {expected}, got {value!r}.")


def assistant_config(config: GenerationConfig) -> GenerationConfig:
    """The draft's own generation config, where HF's candidate generator reads the draft options.

    HF reads `num_assistant_tokens`, its schedule and the confidence threshold from
    `assistant_model.generation_config`; here they are options of the `generate` call.
    """
    values = {name: getattr(config, name, None) for name in ASSISTANT_OPTIONS}
    return GenerationConfig(**{name: value for name, value in values.items() if value is not None})


def assisted_decode(adapter: ModelAdapter, *, sequences: torch.LongTensor, mask: torch.LongTensor,
                    state: dict[str, Any], config: GenerationConfig, processors: LogitsProcessorList,
                    user_processors: LogitsProcessorList, criteria: Any, streamer: Any, assistant: Any,
                    model_inputs: dict[str, Any], layout: Any, vocab_size: int | None) -> tuple[Any, _Runner]:
    """Run HF's `_assisted_decoding` for the installed transformers; returns its result and the target runner."""
    runner = _Runner(adapter, state, layout=layout, vocab_size=vocab_size, role="target")
    host = _TargetHost(runner, sequences.device, model_inputs)
    assistant_host = None
    if assistant is not None:
        assistant_host = _AssistantHost(assistant, device=sequences.device,
                                        generation_config=assistant_config(config), layout=layout,
                                        vocab_size=vocab_size)
    host.assistant, host.do_sample = assistant_host, bool(config.do_sample)
    if vocab_size is not None:
        host.config.vocab_size = vocab_size
    elif config.prompt_lookup_num_tokens is not None and len(processors) > 0 and _lookup_screens_candidates():
        host.config.vocab_size = _probe_vocab(adapter, sequences, mask, model_inputs, layout)
    else:
        host.config.vocab_size = int(sequences.max()) + 1  # wide enough to index any prompt token; see below
    model_kwargs: dict[str, Any] = {"use_cache": True, "past_key_values": host.cache, **model_inputs}
    if _TRANSFORMERS_MAJOR < 5 or bool((mask == 0).any()):
        # transformers 5's generate drops an all-ones mask; its assistant then infers one from the pad id
        model_kwargs["attention_mask"] = mask
    loop = cast(Any, host)._assisted_decoding
    parameters = inspect.signature(loop).parameters
    kwargs: dict[str, Any] = {"logits_processor": processors, "stopping_criteria": criteria,
                              "generation_config": config, "synced_gpus": False, "streamer": streamer}
    if "candidate_generator" in parameters:  # transformers 4.x: generate() builds it, with the user's processors
        kwargs["candidate_generator"] = host._get_candidate_generator(
            generation_config=config, input_ids=sequences, inputs_tensor=sequences, assistant_model=assistant_host,
            logits_processor=user_processors, target_tokenizer=None, assistant_tokenizer=None,
            model_kwargs=model_kwargs)
    else:
        kwargs.update(inputs_tensor=sequences, assistant_model=assistant_host, assistant_tokenizer=None,
                      tokenizer=None)
    result = loop(sequences, **kwargs, **model_kwargs)
    return result, runner


def _lookup_screens_candidates() -> bool:
    """Whether the installed prompt lookup drops candidates its logits processors forbid (transformers 5)."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    return "logits_processor" in inspect.signature(PromptLookupCandidateGenerator.__init__).parameters


def _probe_vocab(adapter: ModelAdapter, sequences: torch.LongTensor, mask: torch.LongTensor,
                 model_inputs: dict[str, Any], layout: Any) -> int:
    """The logits width, from one call on the prompt with a throw-away state.

    transformers 5's prompt lookup runs the processors on a `(1, vocab_size)` row before the first
    model call; HF takes the width from the model's config, which a plain callable does not have.
    `vocab_size=` saves this call.
    """
    state = adapter.start(sequences, mask, dict(model_inputs))
    outputs = adapter.forward(sequences, state)
    logits = extract_logits(adapter.logits(outputs))
    parsed = Layout.for_tensor(logits, layout)
    return int(logits.shape[parsed.axes.index("v")])
