"""`generate`: HF's decoding loop (`GenerationMixin._sample`) for models that are just callables.

One call of `generate`, in the order of HF's `generate`:
1. check the arguments and split `**kwargs` into generation options and model inputs (`args.py`);
2. merge the options into a `GenerationConfig` as HF does (`_prepare_generation_config`), with
   lengths (`_prepare_generated_length`) and special tokens (`_prepare_special_tokens`) from HF;
3. expand the prompt for `num_return_sequences`, put it in the streamer;
4. build HF's stopping criteria and a fresh `Sampler` (HF's logits processors) for this call;
5. run the strategy the config selects (`strategies.py`: mode -> runner). Greedy search and
   sampling loop (`loop.py`): `forward` (the model adapter) -> last-position rows -> `process` ->
   `choose` -> append (finished rows get `pad_token_id`) -> streamer -> stopping criteria, until
   every row is finished (`finished.py`: at most one host read per step; `lockstep.py`:
   `synced_gpus`); beam search and assisted decoding run HF's own loops (`hf_loops/`).

The keyword arguments travel down as one `GenerateOptions` (`options.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, overload

import torch
from transformers import GenerationConfig
from transformers.generation.utils import GenerateBeamDecoderOnlyOutput, GenerateDecoderOnlyOutput

from hfbridge._generate.call import prepare
from hfbridge._generate.lockstep import resolve as resolve_synced_gpus
from hfbridge._generate.loop import LoopOptions, check_every_option
from hfbridge._generate.options import GenerateOptions
from hfbridge._generate.stateful_calls import Stateful
from hfbridge._generate.strategies import STRATEGIES, check_loop_options
from hfbridge._generate.unconditional_branch import check_guidance_loop
from hfbridge._models.adapters import ModelAdapter
from hfbridge._models.choose import as_adapter
from hfbridge._step.checks.option_checks import check_flag
from hfbridge._step.plan.option_docs import fill_options
from hfbridge._step.run.layout import LayoutLike


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
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    progress: bool = False,
    fast: bool = False,
    max_context: int | None = None,
    prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
    assistant_model: Callable[..., Any] | ModelAdapter | None = None,
    check_every: int = 1,
    synced_gpus: bool | None = None,
    thinking_options: Mapping[str, Any] | None = None,
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
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    progress: bool = False,
    fast: bool = False,
    max_context: int | None = None,
    prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
    assistant_model: Callable[..., Any] | ModelAdapter | None = None,
    check_every: int = 1,
    synced_gpus: bool | None = None,
    thinking_options: Mapping[str, Any] | None = None,
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
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    progress: bool = False,
    fast: bool = False,
    max_context: int | None = None,
    prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
    assistant_model: Callable[..., Any] | ModelAdapter | None = None,
    check_every: int = 1,
    synced_gpus: bool | None = None,
    thinking_options: Mapping[str, Any] | None = None,
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
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    progress: bool = False,
    fast: bool = False,
    max_context: int | None = None,
    prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
    assistant_model: Callable[..., Any] | ModelAdapter | None = None,
    check_every: int = 1,
    synced_gpus: bool | None = None,
    thinking_options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> torch.Tensor | GenerateDecoderOnlyOutput | GenerateBeamDecoderOnlyOutput:
    """Generate tokens with any model, with the decoding loop of HF's `model.generate()`.

    For the same options and the same `torch.manual_seed`, the result is token for token what
    `model.generate()` returns for an HF model called the same way (greedy, sampling, beam search and
    beam sampling; `num_beams > 1` runs HF's own beam loop, see docs/generate.md).

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
            `logits_processor=`, also accepted under that name), merged with the ones the options
            create as HF merges them. Stateful ones receive one call per new token and the full
            vocabulary; those with `reset`, `reorder` and `rollback` (`hfbridge.processors`'
            stateful protocol) are reset when the call starts, follow the beams of beam search and
            forget rejected draft tokens in assisted decoding.
        stopping_criteria: Extra `StoppingCriteria` (HF's `stopping_criteria=`).
        streamer: A `transformers` streamer (`TextStreamer`, `TextIteratorStreamer`, any object with
            `put`/`end`): receives the prompt first, then each step's tokens, as HF sends them.
        tokenizer: Needed for `stop_strings` (HF's `StopStringCriteria`) and for DRY's string
            sequence breakers (`dry_sequence_breakers`, strings by default). Without `vocab_size`,
            the logits' columns from the tokenizer's size on are padding and never chosen (a model
            that is a transformers model keeps every column, as its `model.generate`).
        layout: The logits' layout when not `"b t v"`, e.g. `"t b v"`, `"b v"` (see `Sampler`).
        vocab_size: The real vocabulary size when the model's output is padded (extra columns can
            never be chosen). Default: the tokenizer's size when one is passed, else every column.
        generator: A `torch.Generator` for sampling, or a list with one per returned sequence
            (prompts x `num_return_sequences`): row i drawn from generator i only, so it does not
            depend on the rest of the batch. Default: the global RNG, as HF.
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
        thinking_options: The options that differ while a row is thinking (its last `thinking_start` not
            closed by a `thinking_end`; the prompt may open it), e.g. `{"temperature": 0.9, "top_p": 0.95}`:
            a thinking row's step uses the call's options updated with these. The tags as for
            `thinking_budget` (`thinking_start` / `thinking_end`: strings with `tokenizer=`, or token ids);
            the budget's forced end closes the span too. Greedy search and sampling (see docs/samplers.md,
            "Phase-aware sampling"). Default: None (the same options throughout).
        **kwargs: `GenerationConfig` options (`max_new_tokens`, `do_sample`, `temperature`,
            `top_p`, `repetition_penalty`, `eos_token_id`, `min_new_tokens`, `stop_strings`,
            `max_time`, `num_return_sequences`, `return_dict_in_generate`, `output_scores`,
            `output_logits`, ...); the numeric sampling options and penalties also take one value
            per prompt (a list, tuple or 1-D tensor; a temperature of 0 is greedy). The options of
            `hfbridge.processors`' samplers (docs/samplers.md).
            [registry options]
            Any other name is a model input: it goes into the adapter's
            state and to the model at every call (tensors with a leading batch axis are repeated
            for `num_return_sequences`), and must be a parameter the model accepts.
            Classifier-free guidance (`guidance_scale=` != 1) also takes HF's `negative_prompt_ids=` /
            `negative_prompt_attention_mask=` `(batch, seq)`; the unconditional sequence runs through
            the same adapter with its own state, one call per step as HF's processor makes them (an
            `InputPos` model needs `unconditional_model=`, a second `InputPos` with its own caches;
            see docs/guidance_watermark.md). `watermarking_config=` builds HF's watermark processor
            for the logits' vocabulary. `banned_strings=[...]` (case-insensitive substrings, or a
            `BannedStrings`), `banned_regex=[...]` and `banned_max_rewinds=` (default 32), with
            `tokenizer=`: a row whose text comes to hold a ban rolls back to the token where the match
            began and forbids it there (greedy search and sampling; see docs/banned_strings.md).

    Returns:
        The sequences `(batch * num_return_sequences, prompt + new)`, prompt included, on the
        device of `input_ids`; finished rows are filled with `pad_token_id`. With
        `return_dict_in_generate=True`, HF's `GenerateDecoderOnlyOutput` with `sequences`, and
        `scores` (processed) / `logits` (raw float32) per step when `output_scores` /
        `output_logits` ask for them, and the cache for a `ReturnsCache` model (`past_key_values`;
        `cache` since transformers 5.24). Beam search
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
    processors, kwargs = _hf_names(processors, kwargs)
    options = GenerateOptions(
        attention_mask=attention_mask, generation_config=generation_config, processors=processors,
        stopping_criteria=stopping_criteria, streamer=streamer, tokenizer=tokenizer, layout=layout,
        vocab_size=vocab_size, generator=generator, progress=progress, fast=fast, max_context=max_context,
        prefix_allowed_tokens_fn=prefix_allowed_tokens_fn, assistant_model=assistant_model,
        check_every=check_every, synced_gpus=synced_gpus, thinking_options=thinking_options, kwargs=kwargs)
    with torch.no_grad():  # as HF's generate: no autograd graph grows over the steps
        return _generate(model, input_ids, options)


generate.__doc__ = fill_options(generate.__doc__)  # the registry's options, listed in help()


def _generate(model: Any, input_ids: Any, options: GenerateOptions) -> Any:
    check_flag("progress", options.progress, optional=False)
    adapter = as_adapter(model, max_context=options.max_context)
    loop = LoopOptions(check_every=check_every_option(options.check_every),
                       synced=resolve_synced_gpus(options.synced_gpus, adapter.model))
    call = prepare(adapter, input_ids, options, STRATEGIES)  # the mode decided once: its row is `call.strategy`
    strategy = call.strategy
    assert strategy is not None and strategy.run is not None  # `prepare` refuses the modes not run
    check_loop_options(strategy, loop)
    check_guidance_loop(call.config, loop.synced)
    Stateful(call.sampler).reset()  # your own processors may have run before: a fresh start
    return strategy.run(adapter, call, options, loop)


def _hf_names(processors: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """HF's `logits_processor=` taken as `processors=` (both given: an error)."""
    if "logits_processor" not in kwargs:
        return processors, kwargs
    kwargs = dict(kwargs)
    alias = kwargs.pop("logits_processor")
    if alias is None:
        return processors, kwargs
    if processors is not None:
        raise TypeError("generate() got both `processors=` and `logits_processor=` (HF's name for the same "
                        "argument); pass your logits processors once.")
    return alias, kwargs
