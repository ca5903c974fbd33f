"""`sample_step`: one call, logits in, next tokens out, with the `Sampler`s it builds kept for reuse.

Building a `Sampler` (HF's config preparation and processors) costs several times a greedy step
on CPU, so calling `sample_step` in a loop reuses the one built for the same plain options,
vocabulary width and device (`_reusable_sampler`).

>>> import torch
>>> sample_step(torch.tensor([[0.0, 2.0, 1.0]]), top_k=1, do_sample=True).tolist()
[1]
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from transformers import GenerationConfig

from hfbridge._step.plan.guidance_processor import refuse_synthid_step, step_guidance
from hfbridge._step.plan.option_docs import fill_options
from hfbridge._step.run.layout import Layout, LayoutLike
from hfbridge._step.run.sampler import Sampler, extract_logits

__all__ = ["sample_step"]


def sample_step(
    logits: Any,
    input_ids: torch.Tensor | None = None,
    *,
    processors: Iterable[Callable] | None = None,
    generation_config: GenerationConfig | None = None,
    layout: LayoutLike = None,
    vocab_size: int | None = None,
    do_sample: bool | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    prompt_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    fast: bool = False,
    prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
    unconditional_logits: Any = None,
    tokenizer: Any = None,
    thinking_options: Mapping[str, Any] | None = None,
    **generation_kwargs: Any,
) -> torch.Tensor:
    """The next tokens for `logits`, as HF's `generate` would choose them with these options.

    Takes the last position of every batch element, applies HF's logits processors in HF's order
    with HF's defaults (on a float32 copy: the caller's tensors are never modified), then takes the
    argmax or draws from the softmax. See `Sampler` for every argument; build a `Sampler` once to
    avoid rebuilding the processors at each step.

    Args:
        logits: A tensor or a model output (tuple/list, mapping with "logits", `ModelOutput`).
        input_ids: The tokens so far, `(*batch, seq)`; processors such as repetition penalty
            read them. Default: no context.
        unconditional_logits: For `guidance_scale` (classifier-free guidance): the model's output
            for this step on the unconditional (or negative) sequence, in the layout of `logits`;
            its last position is mixed in as HF's guidance processor mixes it. A `watermarking_config`
            of SynthID Text keeps state from step to step: use a `Sampler` for it.
        tokenizer: For DRY's string sequence breakers; without `vocab_size`, the logits' columns
            from its size on are padding and dropped (see `Sampler`).
        thinking_options: The options that differ for the rows inside a thinking span (see `Sampler`):
            each row's token is the one this call gives it with the options of its phase.
        **generation_kwargs: HF's `GenerationConfig` options that make logits processors
            (`temperature`, `top_k`, `top_p`, `min_p`, `typical_p`, `epsilon_cutoff`, `eta_cutoff`,
            `top_h`, `repetition_penalty`, `no_repeat_ngram_size`, `bad_words_ids`,
            `suppress_tokens`, `min_new_tokens`, `guidance_scale`, `watermarking_config`, ...; the
            numeric ones take one value per row), and the community samplers' options
            (`hfbridge.processors`, docs/samplers.md).
            [registry options]

    Returns:
        Token ids with the layout's batch shape (`(batch,)` for `"b t v"`, 0-d for `"v"`), on the
        logits' device.

    >>> import torch
    >>> logits = torch.tensor([[[0.0, 1.0, 3.0], [0.0, 3.0, 1.0]]])   # [B=1, T=2, V=3]
    >>> sample_step(logits).tolist()                                     # greedy on the last position
    [1]
    >>> sample_step(logits, torch.tensor([[1, 1]]), repetition_penalty=4.0).tolist()
    [2]
    """
    options = dict(layout=layout, vocab_size=vocab_size, do_sample=do_sample, prompt_length=prompt_length,
                   fast=fast, **generation_kwargs)
    if prefix_allowed_tokens_fn is not None:
        options["prefix_allowed_tokens_fn"] = prefix_allowed_tokens_fn
    refuse_synthid_step(generation_kwargs, generation_config)  # SynthID keeps state between steps: a Sampler's job
    options.update(step_guidance(unconditional_logits))  # guidance_scale's logits (`_step/plan/guidance_processor.py`)
    if tokenizer is not None:
        options["tokenizer"] = tokenizer
    # XTC draws from the generator: a cached Sampler's processors hold none, so build one for it
    own_generator = generator is not None and generation_kwargs.get("xtc_probability") is not None
    if thinking_options is not None:
        options["thinking_options"] = thinking_options  # its phases' samplers hold the generator: built each call
    if generation_config is None and processors is None and attention_mask is None and tokenizer is None \
            and not own_generator and thinking_options is None:
        logits = extract_logits(logits)
        sampler = _reusable_sampler(logits, options)
        if sampler is not None:
            if generator is not None:
                sampler = sampler.with_generator(generator)  # the cached one keeps no generator
            return sampler(logits, input_ids)
    sampler = Sampler(generation_config, processors=processors, generator=generator,
                      attention_mask=attention_mask, **options)
    return sampler(logits, input_ids)


sample_step.__doc__ = fill_options(sample_step.__doc__)  # the registry's options, listed in help()


# Building a Sampler (HF's config preparation and processors) costs several times a greedy step on
# CPU, so `sample_step` keeps the last few. Threads share the cache: a lock guards every
# read and write (building happens outside it; two threads building the same key both get a
# working Sampler and the later one stays).
_SAMPLER_CACHE: OrderedDict[Any, Sampler] = OrderedDict()
_SAMPLER_CACHE_SIZE = 32
_SAMPLER_CACHE_LOCK = threading.Lock()


def _reusable_sampler(logits: torch.Tensor, options: dict[str, Any]) -> Sampler | None:
    """A Sampler built earlier for the same options, vocabulary width and device, so that calling
    `sample_step` in a loop does not rebuild HF's processors every step (they cost milliseconds).

    Only plain option values are cached (numbers, strings, lists, dicts, tuples); the processors
    built for them keep nothing between calls but tensors sized by the vocabulary and device,
    which are part of the key. A Sampler whose processors keep state per row (mirostat) is never
    cached: every `sample_step` call starts afresh. Returns None when the options cannot be a key. The cache holds
    at most `_SAMPLER_CACHE_SIZE` samplers, least recently used out first.
    """
    layout = options.get("layout")
    if layout is not None and not isinstance(layout, str):
        return None
    try:
        parsed = Layout.for_tensor(logits, layout)
        parsed.check(logits)
        width = logits.shape[parsed.axes.index("v")]
        key = (_frozen(options), width, logits.device)
    except (TypeError, ValueError):
        return None  # the Sampler built below raises the full error
    with _SAMPLER_CACHE_LOCK:
        sampler = _SAMPLER_CACHE.get(key)
        if sampler is not None:
            _SAMPLER_CACHE.move_to_end(key)
            return sampler
    sampler = Sampler(**options)
    if sampler.is_stateful:
        return sampler  # mirostat keeps state per row: each call starts afresh, with its own Sampler
    with _SAMPLER_CACHE_LOCK:
        _SAMPLER_CACHE[key] = sampler
        while len(_SAMPLER_CACHE) > _SAMPLER_CACHE_SIZE:
            _SAMPLER_CACHE.popitem(last=False)
    return sampler


def _frozen(value: Any) -> Any:
    """A hashable copy of a plain option value; TypeError for anything else (tensors, objects)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(item) for item in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(_frozen(k)), _frozen(v)) for k, v in value.items())))
    raise TypeError(f"not a plain option value: {type(value).__name__}")
