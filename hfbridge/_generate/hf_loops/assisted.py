"""Assisted (speculative) and prompt-lookup decoding: HF's own `_assisted_decoding`, run on adapters.

`generate` hands a prepared call here when the options select HF's assisted generation mode
(`assistant_model=`, or `prompt_lookup_num_tokens=`). The installed transformers' loop, candidate
generators, speculative sampling and draft-length schedules run unchanged on `TargetHost` (the
target) and `DraftHost` (the assistant; see `_generate/hf_loops/assisted_stand_ins.py`), so the result is HF's by
construction on every supported version. Rolling back rejected drafts goes through
`ModelAdapter.crop` (see `_cache.crop_cache`).

Greedy assisted decoding returns greedy search's tokens; only the number of model calls changes:

>>> import torch
>>> from hfbridge import generate
>>> table = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))  # a bigram "model"
>>> model, prompt = (lambda ids: table[ids]), torch.tensor([[1, 2]])
>>> looked_up = generate(model, prompt, prompt_lookup_num_tokens=2, max_new_tokens=6)
>>> torch.equal(looked_up, generate(model, prompt, max_new_tokens=6))
True
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from hfbridge._generate.call import progress_bar as _progress_bar
from hfbridge._generate.hf_loops.assisted_stand_ins import DraftHost, TargetHost
from hfbridge._generate.hf_loops.loop_stand_in import StepProcessors
from hfbridge._hf import names
from hfbridge._hf.loops import lookup_screens_candidates, run_assisted_decoding
from hfbridge._hf.outputs import with_cache
from hfbridge._models.adapters import InputPos, ModelAdapter, Recompute
from hfbridge._models.choose import as_adapter
from hfbridge._step.checks.option_checks import check_strategy_options
from hfbridge._step.plan.hf_option_rows import HF_OPTION_ROWS
from hfbridge._step.run.layout import Layout
from hfbridge._step.run.sampler import Sampler, extract_logits

# Options of HF's assisted decoding that are fields of the assistant's own generation config in HF (the registry's
# rows that say `assistant`).
ASSISTANT_OPTIONS = tuple(name for name, row in HF_OPTION_ROWS.items() if row.assistant)


def check_assisted(adapter: ModelAdapter, config: GenerationConfig, options: Any, *, rows: int,
                   model_inputs: dict[str, Any], **ignored: Any) -> None:
    """The strategy row's check (`strategies.STRATEGIES`): what assisted / prompt-lookup decoding cannot
    do here, refused when the call is prepared, before any model call."""
    _check(adapter, _assistant(options.assistant_model), config, batch=rows, generator=options.generator,
           fast=options.fast, model_inputs=model_inputs)


def _assistant(assistant_model: Any) -> ModelAdapter | None:
    try:
        return None if assistant_model is None else as_adapter(assistant_model)
    except TypeError as error:
        raise TypeError(f"`assistant_model`: {error}") from None


def generate_assisted(adapter: ModelAdapter, call: Any, *, assistant_model: Any, streamer: Any, layout: Any,
                      vocab_size: int | None, tokenizer: Any, progress: bool) -> Any:
    """`generate` for assisted and prompt-lookup decoding, from the prepared call (checked by
    `check_assisted`) to the result."""
    model_inputs = adapter.model_inputs(call.state)
    assistant = _assistant(assistant_model)
    if streamer is not None:
        streamer.put(call.sequences.cpu())  # the prompt first, as HF; HF's loop sends the rest and ends it
    bar = _progress_bar(progress, max((call.config.max_length or 0) - call.sequences.shape[1], 0))
    if bar is not None:
        streamer = _ProgressStreamer(streamer, bar)
    try:
        result, host = assisted_decode(
            adapter, sequences=call.sequences, mask=call.mask, state=call.state, config=call.config,
            sampler=call.sampler, user_processors=call.user_processors,
            criteria=call.criteria, streamer=streamer, assistant=assistant, model_inputs=model_inputs,
            layout=layout, vocab_size=vocab_size, tokenizer=tokenizer)
    except BaseException:
        if streamer is not None:
            streamer.end()
        raise
    finally:
        if bar is not None:
            bar.close()
    if isinstance(result, GenerateDecoderOnlyOutput):
        return with_cache(result, adapter.cache(host.state))
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


def _check_options(config: GenerationConfig, has_assistant: bool) -> None:
    """The draft options HF takes without checking them, checked with a message naming the option."""
    lookup = config.prompt_lookup_num_tokens
    if lookup is not None and has_assistant:
        raise ValueError(
            f"`prompt_lookup_num_tokens`={lookup} and `assistant_model` were both given; HF would draft from the "
            "prompt and ignore the assistant. Pass one of them."
        )
    check_strategy_options(config)  # types, finiteness and ranges, as the step's options


def assistant_config(config: GenerationConfig) -> GenerationConfig:
    """The draft's own generation config, where HF's candidate generator reads the draft options.

    HF reads `num_assistant_tokens`, its schedule and the confidence threshold from
    `assistant_model.generation_config`; here they are options of the `generate` call.
    """
    values = {name: getattr(config, name, None) for name in ASSISTANT_OPTIONS}
    return GenerationConfig(**{name: value for name, value in values.items() if value is not None})


def assisted_decode(adapter: ModelAdapter, *, sequences: torch.Tensor, mask: torch.Tensor,
                    state: dict[str, Any], config: GenerationConfig, sampler: Sampler,
                    user_processors: LogitsProcessorList, criteria: Any, streamer: Any, assistant: Any,
                    model_inputs: dict[str, Any], layout: Any, vocab_size: int | None,
                    tokenizer: Any = None) -> tuple[Any, TargetHost]:
    """Run HF's `_assisted_decoding` for the installed transformers; returns its result and the target's host.

    `user_processors` are the caller's own (`processors=`): the draft model runs them (as HF's
    assistant does), beside the processors it builds from the options itself, never the target's.
    """
    host = TargetHost(adapter, state, sampler, device=sequences.device, prompt_length=sequences.shape[1])
    processors = StepProcessors(sampler.processors, host)
    assistant_host = None
    if assistant is not None:
        assistant_host = DraftHost(assistant, device=sequences.device, generation_config=assistant_config(config),
                                   layout=layout, vocab_size=vocab_size, user_processors=user_processors,
                                   tokenizer=tokenizer)
    host.draft, host.do_sample = assistant_host, bool(config.do_sample)
    host.probe_vocab = lambda: _probe_vocab(adapter, sequences, mask, model_inputs, layout)  # only after an error
    if vocab_size is not None:
        host.config.vocab_size = vocab_size
    elif config.prompt_lookup_num_tokens is not None and len(processors) > 0 and lookup_screens_candidates():
        host.config.vocab_size = _probe_vocab(adapter, sequences, mask, model_inputs, layout)
    else:
        host.config.vocab_size = int(sequences.max()) + 1  # wide enough to index any prompt token; see below
    # the call's mask (passed, or inferred as for the target), which HF's loop hands on to the draft; without it
    # the draft would infer one from the pad id, all zeros where the prompt is the pad token (T5's decoder start)
    model_kwargs: dict[str, Any] = {"use_cache": True, names.LOOP_CACHE: host.cache_handle, **model_inputs,
                                    "attention_mask": mask}
    result = run_assisted_decoding(host, sequences, processors=processors, user_processors=user_processors,
                                   criteria=criteria, config=config, streamer=streamer, assistant=assistant_host,
                                   model_kwargs=model_kwargs)
    return result, host


def _probe_vocab(adapter: ModelAdapter, sequences: torch.Tensor, mask: torch.Tensor,
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
