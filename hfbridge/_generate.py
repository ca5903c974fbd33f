"""`generate`: HF's decoding loop (`GenerationMixin._sample`) for models that are just callables.

One call of `generate`, in the order of HF's `generate`:
1. check the arguments and split `**kwargs` into generation options and model inputs (`_generate_args.py`);
2. merge the options into a `GenerationConfig` as HF does (`_prepare_generation_config`), with
   lengths (`_prepare_generated_length`) and special tokens (`_prepare_special_tokens`) from HF;
3. expand the prompt for `num_return_sequences`, put it in the streamer;
4. build HF's stopping criteria and a fresh `Sampler` (HF's logits processors) for this call;
5. loop (`_loop.py`): `forward` (the model adapter) -> last-position rows -> `process` -> `choose`
   -> append (finished rows get `pad_token_id`) -> streamer -> stopping criteria, until every row
   is finished (`_finished.py`: at most one host read per step; `_lockstep.py`: `synced_gpus`).
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Literal, cast, overload

import torch
from transformers import GenerationConfig, StoppingCriteriaList, TextStreamer
from transformers.generation.utils import GenerateBeamDecoderOnlyOutput, GenerateDecoderOnlyOutput

from ._beam import beam_search, check_beam_options
from ._generate_args import check_config, check_loop_options, checked_arguments, has_default_max_length
from ._hf import ProcessorHost, generation_option_names
from ._layout import LayoutLike
from ._lockstep import resolve as resolve_synced_gpus
from ._loop import LoopOptions, check_every_option, decode, pads_finished
from ._models import ModelAdapter, as_adapter
from ._option_checks import check_flag
from ._processors import callable_list, make_generation_config
from ._step import Sampler
from ._strategies import is_assisted, is_beam


# The return type follows `return_dict_in_generate`: a tensor by default, HF's output object with
# `return_dict_in_generate=True`, either when a `generation_config` decides.
@overload
def generate(
    model: Callable[..., Any] | ModelAdapter,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    generation_config: None = None,
    processors: Iterable[Callable] | None = None,
    stopping_criteria: Iterable[Callable] | None = None,
    streamer: Any = None,
    tokenizer: Any = None,
    layout: LayoutLike = None,
    vocab_size: int | None = None,
    generator: torch.Generator | None = None,
    progress: bool = False,
    fast: bool = False,
    max_context: int | None = None,
    prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
    assistant_model: Callable[..., Any] | ModelAdapter | None = None,
    return_dict_in_generate: Literal[False] = False,
    **kwargs: Any,
) -> torch.Tensor: ...


@overload
def generate(
    model: Callable[..., Any] | ModelAdapter,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    processors: Iterable[Callable] | None = None,
    stopping_criteria: Iterable[Callable] | None = None,
    streamer: Any = None,
    tokenizer: Any = None,
    layout: LayoutLike = None,
    vocab_size: int | None = None,
    generator: torch.Generator | None = None,
    progress: bool = False,
    fast: bool = False,
    max_context: int | None = None,
    prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
    assistant_model: Callable[..., Any] | ModelAdapter | None = None,
    return_dict_in_generate: Literal[True],
    **kwargs: Any,
) -> GenerateDecoderOnlyOutput | GenerateBeamDecoderOnlyOutput: ...


@overload
def generate(
    model: Callable[..., Any] | ModelAdapter,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    processors: Iterable[Callable] | None = None,
    stopping_criteria: Iterable[Callable] | None = None,
    streamer: Any = None,
    tokenizer: Any = None,
    layout: LayoutLike = None,
    vocab_size: int | None = None,
    generator: torch.Generator | None = None,
    progress: bool = False,
    fast: bool = False,
    max_context: int | None = None,
    prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
    assistant_model: Callable[..., Any] | ModelAdapter | None = None,
    return_dict_in_generate: bool | None = None,
    **kwargs: Any,
) -> torch.Tensor | GenerateDecoderOnlyOutput | GenerateBeamDecoderOnlyOutput: ...


def generate(
    model: Callable[..., Any] | ModelAdapter,
    input_ids: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    processors: Iterable[Callable] | None = None,
    stopping_criteria: Iterable[Callable] | None = None,
    streamer: Any = None,
    tokenizer: Any = None,
    layout: LayoutLike = None,
    vocab_size: int | None = None,
    generator: torch.Generator | None = None,
    progress: bool = False,
    fast: bool = False,
    max_context: int | None = None,
    prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
    assistant_model: Callable[..., Any] | ModelAdapter | None = None,
    check_every: int = 1,
    synced_gpus: bool | None = None,
    **kwargs: Any,
) -> torch.Tensor | GenerateDecoderOnlyOutput | GenerateBeamDecoderOnlyOutput:
    """Generate tokens with any model, with the decoding loop of HF's `model.generate()`.

    For the same options and the same `torch.manual_seed`, the result is token for token what
    `model.generate()` returns for an HF model called the same way (greedy, sampling, beam search and
    beam sampling; `num_beams > 1` runs HF's own beam loop, see `_beam.py`).

    Args:
        model: A plain callable `model(input_ids) -> logits` that recomputes the whole sequence
            (wrapped in `Recompute`), or an adapter: `Recompute(model, max_context=N)`,
            `InputPos(model)` (gpt-fast `model(idx, input_pos)`), `ReturnsCache(model)`
            (`model(input_ids, cache) -> (logits, cache)`), `Hooks(model, prepare_inputs, update_state)`.
        input_ids: The prompts, `(batch, seq)` integer token ids, left-padded when their lengths
            differ. Never modified.
        attention_mask: `(batch, seq)`, 1 for tokens and 0 for left padding. Default: inferred as
            HF does (0 where `pad_token_id` appears, unless it equals `eos_token_id`), else all ones.
        generation_config: A `transformers.GenerationConfig` to start from (never modified);
            keyword options override it.
        processors: Extra logits processors `(input_ids, scores) -> scores` (HF's
            `logits_processor=`), merged with the ones the options create as HF merges them.
            Stateful ones receive one call per new token and the full vocabulary.
        stopping_criteria: Extra `StoppingCriteria` (HF's `stopping_criteria=`).
        streamer: A `transformers` streamer (`TextStreamer`, `TextIteratorStreamer`, any object with
            `put`/`end`): receives the prompt first, then each step's tokens, as HF sends them.
        tokenizer: Needed for `stop_strings` (HF's `StopStringCriteria`).
        layout: The logits' layout when not `"b t v"`, e.g. `"t b v"`, `"b v"` (see `Sampler`).
        vocab_size: The real vocabulary size when the model's output is padded (extra columns can
            never be chosen).
        generator: A `torch.Generator` for sampling; default: the global RNG, as HF.
        progress: Show a `tqdm.auto` progress bar over the new tokens. Default: False.
        fast: Sample with hfbridge's fused path (HF's distribution, not HF's random stream).
        max_context: For a plain callable: feed at most the last `max_context` tokens
            (same as passing `Recompute(model, max_context=...)`).
        prefix_allowed_tokens_fn: HF's `prefix_allowed_tokens_fn(batch_id, input_ids) -> list[int]`,
            called at every step for every row with its tokens so far `(seq,)`; only the returned
            token ids stay possible (HF's `PrefixConstrainedLogitsProcessor`, where HF puts it).
        assistant_model: A draft model for assisted (speculative) decoding, in any form `model`
            takes; it must share the target's token ids. HF's `_assisted_decoding` then runs:
            the draft proposes `num_assistant_tokens` tokens (options `num_assistant_tokens`,
            `num_assistant_tokens_schedule`, `assistant_confidence_threshold`, which HF reads from
            the assistant's generation config), the target checks them in one call. Greedy output is
            the output without the assistant; sampling is HF's speculative sampling. One prompt.
            `prompt_lookup_num_tokens=` drafts from the prompt instead, without a model.
        check_every: Check for finished rows (eos, stopping criteria) every this many steps
            instead of after every token. Each check reads one device value on the host (a sync
            on a GPU); in between, finished rows get `pad_token_id` as usual, and the steps made
            after the last row finished are cut off, so the tokens are the same for every value.
            Costs up to `check_every - 1` extra model calls at the end (a `ReturnsCache` model's
            returned cache then holds those positions too). With a streamer every step is checked.
            Default: 1 (every step, as HF).
        synced_gpus: Keep the ranks of `torch.distributed` in lockstep, as HF's `synced_gpus`
            (needed under DeepSpeed ZeRO-3 or FSDP): a rank whose rows are finished keeps calling
            its model until every rank is finished (greedy search, sampling and beam search).
            Default None: HF's rule, on when ZeRO-3 is enabled or the model is FSDP-managed and the
            process group has more than one rank.
        **kwargs: `GenerationConfig` options (`max_new_tokens`, `do_sample`, `temperature`,
            `top_p`, `repetition_penalty`, `eos_token_id`, `min_new_tokens`, `stop_strings`,
            `max_time`, `num_return_sequences`, `return_dict_in_generate`, `output_scores`,
            `output_logits`, ...). Any other name is a model input: it goes into the adapter's
            state and to the model at every call (tensors with a leading batch axis are repeated
            for `num_return_sequences`), and must be a parameter the model accepts.

    Returns:
        The sequences `(batch * num_return_sequences, prompt + new)`, prompt included, on the
        device of `input_ids`; finished rows are filled with `pad_token_id`. With
        `return_dict_in_generate=True`, HF's `GenerateDecoderOnlyOutput` with `sequences`, and
        `scores` (processed) / `logits` (raw float32) per step when `output_scores` /
        `output_logits` ask for them, and `past_key_values` for a `ReturnsCache` model. Beam search
        returns `(batch * num_return_sequences, ...)` sequences, or HF's `GenerateBeamDecoderOnlyOutput`
        (`sequences_scores`, `scores`, `logits`, `beam_indices`).

    Runs under `torch.no_grad()`, as HF's `generate`.

    Raises:
        TypeError / ValueError: for bad arguments, before the first model call.
        ValueError: when the model returns logits with the wrong number of rows or vocabulary
            columns, or NaN; the message names the step (step 0 is the prompt's forward pass).
        Exception: whatever the model raises, unchanged, with a note naming the step.

    >>> import torch
    >>> from hfbridge import generate
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> table = torch.randn(16, 16)                       # a bigram "model"
    >>> def model(input_ids):                             # [B, T] -> [B, T, V]
    ...     return table[input_ids]
    >>> out = generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=5, do_sample=True, top_k=4)
    >>> out.shape
    torch.Size([1, 8])
    """
    with torch.no_grad():  # as HF's generate: no autograd graph grows over the steps
        return _generate(model, input_ids, attention_mask=attention_mask, generation_config=generation_config,
                         processors=processors, stopping_criteria=stopping_criteria, streamer=streamer,
                         tokenizer=tokenizer, layout=layout, vocab_size=vocab_size, generator=generator,
                         progress=progress, fast=fast, max_context=max_context,
                         prefix_allowed_tokens_fn=prefix_allowed_tokens_fn, assistant_model=assistant_model,
                         check_every=check_every, synced_gpus=synced_gpus, kwargs=kwargs)


def _generate(model: Any, input_ids: Any, *, attention_mask: Any, generation_config: Any, processors: Any,
              stopping_criteria: Any, streamer: Any, tokenizer: Any, layout: Any, vocab_size: Any, generator: Any,
              progress: bool, fast: bool, max_context: Any, prefix_allowed_tokens_fn: Any, assistant_model: Any,
              check_every: Any, synced_gpus: Any, kwargs: dict[str, Any]) -> torch.Tensor | GenerateDecoderOnlyOutput:
    check_flag("progress", progress, optional=False)
    adapter = as_adapter(model, max_context=max_context)
    loop = LoopOptions(check_every=check_every_option(check_every),
                       synced=resolve_synced_gpus(synced_gpus, adapter.model))
    call = _prepare(adapter, input_ids, attention_mask=attention_mask, generation_config=generation_config,
                    processors=processors, stopping_criteria=stopping_criteria, streamer=streamer,
                    tokenizer=tokenizer, layout=layout, vocab_size=vocab_size, generator=generator, fast=fast,
                    prefix_allowed_tokens_fn=prefix_allowed_tokens_fn, assistant_model=assistant_model,
                    kwargs=kwargs)
    check_loop_options(loop, call.config, assistant_model)
    if is_assisted(call.config, assistant_model):  # HF's own assisted loop on the adapter (`_assisted.py`)
        from ._assisted import generate_assisted

        return generate_assisted(adapter, call, assistant_model=assistant_model, processors=processors,
                                 streamer=streamer, layout=layout, vocab_size=vocab_size, generator=generator,
                                 fast=fast, progress=progress)
    bar = _progress_bar(progress, max((call.config.max_length or 0) - call.sequences.shape[1], 0))
    if is_beam(call.config):  # HF's own beam loop on the adapter (`_beam.py`)
        try:
            return beam_search(adapter, input_ids=call.sequences, attention_mask=call.mask, state=call.state,
                               config=call.config, sampler=call.sampler, criteria=call.criteria,
                               prompts=call.prompts, on_step=None if bar is None else lambda: bar.update(1),
                               synced=loop.synced)
        finally:
            if bar is not None:
                bar.close()
    try:
        if streamer is not None:
            streamer.put(call.sequences.cpu())  # the prompt first, as HF
        _decode(adapter, call, streamer, bar, loop)
    except BaseException:
        if streamer is not None:
            streamer.end()  # so that a TextIteratorStreamer's reader stops instead of waiting forever
        raise
    finally:
        if bar is not None:
            bar.close()
    if streamer is not None:
        streamer.end()

    if call.config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(
            sequences=cast(torch.LongTensor, call.sequences), scores=call.scores, logits=call.raw_logits,
            attentions=None, hidden_states=None, past_key_values=adapter.cache(call.state),
        )
    return call.sequences


@dataclasses.dataclass
class _Call:
    """Everything one `generate` call works with, prepared before the first model call."""

    config: GenerationConfig  # prepared as HF prepares it, special-token tensors set
    sampler: Sampler  # this call's processors (fresh) and token choice
    criteria: StoppingCriteriaList  # HF's own, merged with the user's
    sequences: torch.Tensor  # [N, T], N = prompts x num_return_sequences; grows by one column a step
    mask: torch.Tensor  # [N, T], grows with `sequences`
    state: dict[str, Any]  # the adapter's state
    prompts: int
    expand: int  # num_return_sequences
    scores: tuple | None = None  # per step, when return_dict_in_generate and output_scores
    raw_logits: tuple | None = None  # per step, when return_dict_in_generate and output_logits


def _prepare(adapter: ModelAdapter, input_ids: Any, *, attention_mask: Any, generation_config: Any, processors: Any,
             stopping_criteria: Any, streamer: Any, tokenizer: Any, layout: Any, vocab_size: Any, generator: Any,
             fast: bool, kwargs: dict[str, Any], prefix_allowed_tokens_fn: Any = None,
             assistant_model: Any = None) -> _Call:
    """Steps 1-4: check every argument and build the call's config, criteria, sampler and state."""
    # 1. Arguments, and `**kwargs` split into generation options and model inputs.
    attention_mask, options, model_inputs, layout = checked_arguments(
        adapter, input_ids, attention_mask=attention_mask, generation_config=generation_config, streamer=streamer,
        generator=generator, layout=layout, fast=fast, kwargs=kwargs)
    batch, prompt_length = input_ids.shape
    device = input_ids.device

    # 2. The config, exactly as HF's `generate` prepares it (defaults, lengths, validation, special tokens).
    do_sample = options.pop("do_sample", None)
    config = make_generation_config(generation_config, do_sample=do_sample, prompt_length=prompt_length,
                                    accepted=generation_option_names(), caller="generate", **options)
    check_config(config, tokenizer, assistant_model)
    if is_beam(config):
        check_beam_options(config, adapter, streamer=streamer, generator=generator, fast=fast)
    host = ProcessorHost(device=device)
    host.prepare_special_tokens(config, attention_mask is not None, device, batch_size=batch)
    if attention_mask is None:
        attention_mask = _inferred_mask(host, input_ids, config)
    if batch > 1 and bool((attention_mask[:, -1] == 0).any()):
        warnings.warn(
            "`attention_mask` has padding at the end of some rows (right padding); decoder-only models need "
            "left padding for batched generation (tokenizer padding_side='left').",
            UserWarning,
            stacklevel=3,
        )
    default_max_length = has_default_max_length(options, generation_config)
    host._as_mixin()._validate_generated_length(config, prompt_length, default_max_length)

    # 3. One row per returned sequence (per beam for beam search), as HF's `_expand_inputs_for_generation`.
    expand = config.num_beams if is_beam(config) else (config.num_return_sequences or 1)
    sequences = input_ids.to(dtype=torch.long, copy=True)  # [B, T], our own copy
    mask = attention_mask.to(dtype=torch.long, copy=True)  # [B, T]
    if expand > 1:
        sequences = sequences.repeat_interleave(expand, dim=0)  # [B * n, T]
        mask = mask.repeat_interleave(expand, dim=0)
        model_inputs = {name: _expand(value, batch, expand) for name, value in model_inputs.items()}
    if isinstance(streamer, TextStreamer) and batch * expand > 1:
        raise ValueError(
            f"`streamer` is a {type(streamer).__name__}, which streams one sequence, but generate() would produce "
            f"{batch * expand} ({batch} prompts x num_return_sequences={expand}); pass one prompt with "
            "num_return_sequences=1, or a streamer of your own that handles batches."
        )

    # 4. This call's criteria and processors (fresh: stateful processors start clean).
    criteria = host.stopping_criteria(config, _criteria_list(stopping_criteria), tokenizer=tokenizer)
    if pads_finished(criteria) and config._pad_token_tensor is None:
        raise ValueError(
            "a stopping criterion has an `eos_token_id`, so finished rows need a `pad_token_id`; pass "
            "pad_token_id= (or eos_token_id=, which HF then uses as the pad token)."
        )
    padding = mask if bool((mask == 0).any()) else None  # HF drops an all-ones mask before building processors
    sampler = Sampler.from_prepared(config, processors=processors, layout=layout, vocab_size=vocab_size,
                                    generator=generator, prompt_length=prompt_length, attention_mask=padding,
                                    fast=fast, prefix_allowed_tokens_fn=prefix_allowed_tokens_fn)
    state = adapter.start(sequences, mask, model_inputs)
    return_dict = bool(config.return_dict_in_generate)
    return _Call(config=config, sampler=sampler, criteria=criteria, sequences=sequences, mask=mask, state=state,
                 prompts=batch, expand=expand,
                 scores=() if return_dict and config.output_scores else None,
                 raw_logits=() if return_dict and config.output_logits else None)


def _decode(adapter: ModelAdapter, call: _Call, streamer: Any, bar: Any, loop: LoopOptions | None = None) -> None:
    """Step 5, the loop of HF's `_sample` (`_loop.py`), in place on `call`."""
    decode(adapter, call, streamer, bar, loop or LoopOptions())


def _criteria_list(stopping_criteria: Iterable[Callable] | None) -> StoppingCriteriaList:
    return callable_list(stopping_criteria, StoppingCriteriaList, name="stopping_criteria",
                         contract="(input_ids, scores) -> bool tensor (batch,)")


def _inferred_mask(host: ProcessorHost, input_ids: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
    """HF's `_prepare_attention_mask_for_generation` (its signature differs between versions)."""
    prepare = host._as_mixin()._prepare_attention_mask_for_generation
    parameters = inspect.signature(prepare).parameters
    ids = input_ids.long()
    if "generation_config" in parameters:
        return prepare(ids, config, {})
    return prepare(ids, config._pad_token_tensor, config._eos_token_tensor)


def _expand(value: Any, batch: int, expand: int) -> Any:
    if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == batch:
        return value.repeat_interleave(expand, dim=0)
    return value


def _progress_bar(progress: bool, total: int) -> Any:
    if not progress:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(
            "`progress=True` needs tqdm, which is not installed; install it with `pip install tqdm` "
            "(or, in a clone of hfbridge, `pip install -e \".[progress]\"`)."
        ) from None
    return tqdm(total=total, desc="generate", unit="tok")
