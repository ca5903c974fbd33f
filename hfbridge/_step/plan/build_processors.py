"""Generation options -> HF's own `GenerationConfig`, `LogitsProcessorList` and stopping criteria.

Nothing here re-implements transformers: options are merged with HF's defaults by HF's
`_prepare_generation_config`, and the processor list is built by HF's `_get_logits_processor`,
both run on a stand-in host (`hfbridge._hf.stand_in.ProcessorHost`). What hfbridge adds is checking the
options up front, with messages that say what to change.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import torch
from transformers import GenerationConfig, LogitsProcessorList

from hfbridge._hf.stand_in import ProcessorHost, generation_option_names, prepare_lengths
from hfbridge._step.checks.option_checks import (
    check_config_options,
    check_flag,
    check_option_values,
    did_you_mean,
    warn_without_effect,
)
from hfbridge._step.plan import community_options
from hfbridge._step.plan.guidance_processor import last_position, refuse_without_unconditional, with_unconditional
from hfbridge._step.plan.hf_option_rows import HF_OPTION_ROWS
from hfbridge._step.plan.option_table import ROWS, hf_sampling_options, phase_tags, plain_options
from hfbridge._step.plan.prefix_fn import with_checked_prefix
from hfbridge._step.plan.watermark import deferred
from hfbridge._step.run.processor_list import CheckedProcessorList

# Options whose processor depends on how long the prompt was (the registry's rows say).
_NEEDS_PROMPT_LENGTH = tuple(name for name, row in HF_OPTION_ROWS.items() if "prompt_length" in row.needs)


@functools.cache
def step_option_names() -> frozenset[str]:
    """The generation options `sample_step` accepts on the installed transformers.

    >>> {"temperature", "repetition_penalty"} <= step_option_names()
    True
    """
    hf_rows = [name for name, row in ROWS.items() if not row.community]
    # besides the registry's HF sampling rows, the options that become a logits processor (or decide its
    # parameters) in HF's `_get_logits_processor` (`hf_option_rows`: `step`)
    others = [name for name, row in HF_OPTION_ROWS.items() if row.step]
    return frozenset((*others, *hf_rows)) & generation_option_names()


def check_option_names(options: Iterable[str], accepted: frozenset[str], *, caller: str) -> None:
    """Raise `TypeError` for an option `caller` does not take, with a did-you-mean suggestion."""
    known = generation_option_names()
    for name in options:
        if name in accepted:
            continue
        if name in known:
            raise TypeError(
                f"{caller}() does not use the generation option `{name}`: it chooses one token per row "
                f"(greedy or sampling) with logits processors. Options it takes: {', '.join(sorted(accepted))}."
            )
        raise TypeError(f"{caller}() got an unexpected option `{name}`.{did_you_mean(name, accepted)}")


def resolve_do_sample(do_sample: bool | None, generation_config: GenerationConfig | None,
                      options: Mapping[str, Any]) -> bool:
    """Decide greedy or sampling.

    A `temperature` of 0 is greedy (whatever `do_sample` says, as OpenAI-style APIs and per-row values
    read it); otherwise an explicit `do_sample` wins; otherwise any sampling option passed as a keyword
    (`temperature`, `top_k`, `top_p`, `min_p`, `typical_p`, `epsilon_cutoff`, `eta_cutoff`, `top_h`)
    means sampling; otherwise the `generation_config`'s own `do_sample`; otherwise greedy.

    >>> resolve_do_sample(None, None, {"top_p": 0.9}), resolve_do_sample(None, None, {})
    (True, False)
    """
    if _zero(options.get("temperature")) or (options.get("temperature") is None and generation_config is not None
                                             and _zero(getattr(generation_config, "temperature", None))):
        return False
    if do_sample is not None:
        return bool(do_sample)
    if any(options.get(name) is not None for name in hf_sampling_options()):
        return True
    if generation_config is not None and generation_config.do_sample is not None:
        return bool(generation_config.do_sample)
    return False


def _zero(value: Any) -> bool:
    """A temperature of 0 (a number: `False` is refused by the option's check, not read as 0)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def make_generation_config(
    generation_config: GenerationConfig | None = None,
    *,
    do_sample: bool | None = None,
    prompt_length: int | None = None,
    accepted: frozenset[str] | None = None,
    caller: str = "sample_step",
    host: ProcessorHost | None = None,
    phased: bool = False,
    checked: bool = False,
    **options: Any,
) -> GenerationConfig:
    """A validated copy of `generation_config` with `options` applied, as HF's `generate` makes it.

    HF's defaults for the installed version are filled in (for example `top_k=50` when sampling,
    as `model.generate` does). The caller's config is never modified. `host`: the `ProcessorHost`
    HF's helpers run on; a model's host (`HFModel.host`) makes its `generation_config` the defaults.
    `phased`: the call has `thinking_options`, whose phases `thinking_start` / `thinking_end` mark (so they
    are not options without effect there). `checked`: `options` were checked already (`generate`'s arguments:
    `option_checks.check_options`), so they are not checked again; a passed config's always are.

    >>> make_generation_config(temperature=0.7).do_sample
    True
    """
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(
            f"`generation_config` must be a transformers.GenerationConfig, got {type(generation_config).__name__}."
        )
    options = plain_options(options)  # NumPy values are numbers
    community, options = community_options.split_options(options)  # hfbridge.processors' options
    check_option_names(options, step_option_names() if accepted is None else accepted, caller=caller)
    check_flag("do_sample", do_sample)
    configs = [config for config in (generation_config, host.generation_config if host is not None else None)
               if config is not None]  # the call's, then the model's own (HF's merge fills in from it)
    # a tuning option whose processor no option switches on does nothing: said, and it does not turn sampling on
    given = {**options, **community}
    if phased:  # the tags mark the phases of `thinking_options`: in use without a budget
        given = {name: value for name, value in given.items() if name not in phase_tags()}
    idle = warn_without_effect(given, configs)
    if generation_config is not None:  # the config's own, with the keywords' switches
        carried = {name: getattr(generation_config, name, None) for name in community_options.OPTIONS
                   if name not in given}
        warn_without_effect({**carried, **given}, configs, where=" in `generation_config`", names=carried)
    if do_sample is None and any(community.get(name) is not None and name not in idle
                                 for name in community_options.warper_options()):
        do_sample = True  # as a sampling option of HF's would
    top_k_passed = options.get("top_k") is not None or any(_sets_top_k(config) for config in configs)
    if not top_k_passed and any(off(community.get(name, next((getattr(config, name) for config in configs
                                                              if getattr(config, name, None) is not None), None)))
                                for name, off in _no_default_top_k().items()):
        options["top_k"] = 0  # HF's default top_k=50 is off for mirostat and top-nσ (docs/samplers.md)
    passed = {name: value for name, value in options.items() if name != "top_k" or top_k_passed}  # not ours
    greedy_by_temperature = _zero(options.get("temperature")) or (
        options.get("temperature") is None and generation_config is not None and _zero(generation_config.temperature))
    if greedy_by_temperature:  # temperature 0 is greedy: HF's warpers never see it
        do_sample = False
        options = {name: value for name, value in options.items() if name != "temperature"}
    if prompt_length is not None and not (isinstance(prompt_length, int) and not isinstance(prompt_length, bool)):
        raise TypeError(f"`prompt_length` must be an int (the prompt's length in tokens), got "
                        f"{type(prompt_length).__name__} {prompt_length!r}.")
    if not checked:  # before HF reads them: HF lets NaN, bools for ints and strings for flags through
        check_option_values(options)
    if generation_config is not None:  # the config's options, hfbridge.processors' included
        check_config_options(generation_config, where="in `generation_config`")
    if not checked:
        community_options.check_community(community)
    if generation_config is not None and greedy_by_temperature:
        generation_config = copy.deepcopy(generation_config)
        generation_config.temperature = None
    host = host if host is not None else ProcessorHost()  # a model's host carries its generation_config
    base = generation_config
    if base is None or base.do_sample is None:
        base = host.generation_config  # the model's, where HF's merge would take do_sample from it
    sample = resolve_do_sample(do_sample, base, passed)  # the top_k=0 set above is no sampling option passed
    if generation_config is None or generation_config.do_sample != sample:
        options = {**options, "do_sample": sample}
    config, unused = host.prepare_config(generation_config, **options)
    if unused:  # pragma: no cover - names were checked above
        raise TypeError(f"{caller}() got options transformers does not know: {sorted(unused)}")
    config.validate()
    community_options.carry_options(config, community)
    _check_values(config)
    # guidance_scale needs `unconditional=` where the processors are built (`processors_for_config`)
    if accepted is None:
        _refuse_other_strategies(config, generation_config, caller)
    needing = [name for name in _NEEDS_PROMPT_LENGTH if getattr(config, name, None) is not None]
    if prompt_length is None and needing:
        raise ValueError(
            f"`{needing[0]}` depends on how many tokens the prompt had: pass `prompt_length=` "
            f"(the prompt's length in tokens, without the generated ones)."
        )
    if prompt_length is not None:
        if not isinstance(prompt_length, int) or prompt_length < 0:
            raise ValueError(f"`prompt_length` must be a non-negative int, got {prompt_length!r}.")
        prepare_lengths(host, config, user_config=generation_config, options=options, prompt_length=prompt_length)
    return config


def _check_values(config: GenerationConfig) -> None:
    """Run HF's own range checks on every option of the registry's HF rows, including values HF would
    silently ignore (`top_p=1.5`)."""
    from transformers.generation import logits_process

    for name, row in ROWS.items():
        if row.community:
            continue
        value = getattr(config, name, None)
        if value is None or value == row.off or (row.sampling and not config.do_sample):
            continue
        processor_class = getattr(logits_process, row.processor, None)
        if processor_class is None:
            continue
        try:
            processor_class(value)
        except ValueError as error:
            raise ValueError(f"`{name}`={value!r} is out of range: {error}") from None


def _refuse_other_strategies(config: GenerationConfig, user_config: GenerationConfig | None, caller: str) -> None:
    """A `generation_config` that selects beam search (or another strategy) is refused like the keyword.

    The step chooses one token per row; HF's warpers built for `num_beams=4` keep at least two
    tokens each, so accepting such a config would silently change the distribution.
    """
    mode = config.get_generation_mode()
    mode_name = getattr(mode, "value", str(mode))
    if mode_name in ("greedy_search", "sample"):
        return
    culprit = next((name for name, is_set in _STRATEGY_OPTIONS.items() if is_set(getattr(config, name, None))), None)
    where = " (set in `generation_config`)" if user_config is not None else ""
    if culprit is not None:
        raise TypeError(
            f"{caller}() does not use the generation option `{culprit}`={getattr(config, culprit)!r}{where}: it "
            f"chooses one token per row (greedy or sampling) with logits processors, and these options select "
            f"{mode_name.replace('_', ' ')}. Set `{culprit}` back to its default for the step."
        )
    raise TypeError(f"{caller}() chooses one token per row (greedy or sampling); the options{where} select "
                    f"{mode_name.replace('_', ' ')}.")


# Options that select a decoding strategy other than greedy or sampling (HF's `get_generation_mode`),
# with the test for "set": the registry's rows (`hf_option_rows`: `selects`).
_STRATEGY_OPTIONS = {name: row.selects for name, row in HF_OPTION_ROWS.items() if row.selects is not None}


def _no_default_top_k() -> dict[str, Callable[[Any], bool]]:
    """Options after which HF's default `top_k=50` is off unless `top_k` is passed (the rows' `drops_top_k`):
    llama.cpp runs mirostat without top-k, and top-nσ's paper applies it to the whole distribution."""
    return {name: row.drops_top_k for name, row in ROWS.items() if row.drops_top_k is not None}


def build_processors(
    generation_config: GenerationConfig | None = None,
    *,
    processors: Iterable[Callable] | None = None,
    prompt_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str | None = None,
    do_sample: bool | None = None,
    prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
    unconditional: Callable[[torch.Tensor], Any] | None = None,
    tokenizer: Any = None,
    **generation_kwargs: Any,
) -> LogitsProcessorList:
    """The `LogitsProcessorList` HF's `generate` would build for these options, in HF's order.

    Args:
        generation_config: A `GenerationConfig` to start from (not modified). Default: HF's defaults.
        processors: Your own processors (any `(input_ids, scores) -> scores` callables), merged
            as `generate` merges `logits_processor=`: one of the same class as a built one replaces
            it in place, the others run after the built non-sampling processors.
        prompt_length: Number of prompt tokens; needed by `min_new_tokens`, `max_new_tokens`,
            `exponential_decay_length_penalty` and `begin_suppress_tokens`.
        attention_mask: `(batch, seq)` prompt mask; transformers versions that support it use it
            to keep repetition penalty off left padding.
        device: Device for the tensors processors hold (eos ids). Default: CPU.
        do_sample: Greedy or sampling; `None` decides as `sample_step` documents.
        prefix_allowed_tokens_fn: HF's `prefix_allowed_tokens_fn(batch_id, input_ids) -> list[int]`:
            the tokens allowed after the row's tokens `input_ids` `(seq,)`; HF's
            `PrefixConstrainedLogitsProcessor` masks every other token (lm-format-enforcer's entry point).
        unconditional: For `guidance_scale`: `unconditional(input_ids) -> logits`, the model's logits on
            the unconditional (or negative) prompt, called once per step by HF's guidance processor
            (docs/guidance_watermark.md). Required with `guidance_scale` != 1.
        tokenizer: For DRY's string sequence breakers (`dry_sequence_breakers`).
        **generation_kwargs: `GenerationConfig` options (`temperature`, `top_p`, `repetition_penalty`, ...).

    >>> [type(p).__name__ for p in build_processors(temperature=0.7, top_p=0.9)]
    ['TemperatureLogitsWarper', 'TopKLogitsWarper', 'TopPLogitsWarper']
    """
    config = make_generation_config(
        generation_config, do_sample=do_sample, prompt_length=prompt_length, **generation_kwargs
    )
    return processors_for_config(config, processors=processors, prompt_length=prompt_length,
                                 attention_mask=attention_mask, device=device,
                                 prefix_allowed_tokens_fn=prefix_allowed_tokens_fn, unconditional=unconditional,
                                 tokenizer=tokenizer)


def processors_for_config(
    config: GenerationConfig,
    *,
    processors: Iterable[Callable] | None = None,
    prompt_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str | None = None,
    prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Any] | None = None,
    unconditional: Callable[[torch.Tensor], Any] | None = None,
    rows: Callable[[Any], torch.Tensor] | None = None,
    tokenizer: Any = None,
    generator: Any = None,  # one torch.Generator, or per-row ones (XTC refuses those)
) -> LogitsProcessorList:
    """HF's `_get_logits_processor` for an already prepared config (see `make_generation_config`),
    as a `CheckedProcessorList` (each processor's output is checked when the list is called).

    Sets the config's private special-token tensors (`_eos_token_tensor`, ...) as `generate` does.
    `unconditional(input_ids) -> logits` feeds `guidance_scale` (see `hfbridge._step.plan.guidance_processor`), `rows`
    turns its output into `(rows, vocab)` logits (default: the last position of `(batch, seq, vocab)`).
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    check_prefix_allowed_tokens_fn(prefix_allowed_tokens_fn)
    user = _as_processor_list(processors)
    host = ProcessorHost(device=device)
    # None, not False, for "no mask": HF then skips its padding warnings, which are `generate`'s to give.
    host.prepare_special_tokens(config, True if attention_mask is not None else None, device)
    guidance_scale = getattr(config, "guidance_scale", None)
    if guidance_scale not in (None, 1, 1.0) and unconditional is None:
        refuse_without_unconditional(guidance_scale)
    watermarked = deferred(config, host) if getattr(config, "watermarking_config", None) is not None else config
    built = host.logits_processor(watermarked, prompt_length=prompt_length, processors=user,
                                  device=device, attention_mask=attention_mask,
                                  prefix_allowed_tokens_fn=prefix_allowed_tokens_fn)
    if unconditional is not None:
        built = with_unconditional(built, unconditional, rows if rows is not None else last_position, built_by=host)
    # hfbridge.processors' samplers asked for by options, in their places (`community_options`)
    built = community_options.add_processors(built, config, tokenizer=tokenizer, generator=generator,
                                             prompt_length=prompt_length)
    # HF's items in HF's order; each output is checked when called (prefix_allowed_tokens_fn's answers too, built
    # from the argument or passed among `processors`)
    checked = with_checked_prefix(built) if prefix_allowed_tokens_fn is not None or user else built
    return CheckedProcessorList(checked)


def check_prefix_allowed_tokens_fn(function: Any) -> None:
    """Raise `TypeError` unless `function` is None or callable as HF calls it."""
    if function is not None and not callable(function):
        raise TypeError(
            "`prefix_allowed_tokens_fn` must be callable as prefix_allowed_tokens_fn(batch_id, input_ids) -> "
            f"list of allowed token ids, got {type(function).__name__}."
        )


def _as_processor_list(processors: Iterable[Callable] | None) -> LogitsProcessorList:
    return callable_list(processors, LogitsProcessorList, name="processors",
                         contract="(input_ids, scores) -> scores")


_L = TypeVar("_L", bound=list)


def callable_list(items: Iterable[Callable] | Callable | None, list_type: type[_L], *, name: str, contract: str) -> _L:
    """`items` (one callable, an iterable of them, or None) as a `list_type`, each item checked.

    >>> len(callable_list([len, abs], list, name="processors", contract="x -> y"))
    2
    """
    result = list_type()
    if items is None:
        return result
    if callable(items) and not isinstance(items, (list, tuple)):
        items = [items]
    for index, item in enumerate(items):
        if not callable(item):
            raise TypeError(f"`{name}[{index}]` must be callable as {contract}, got {type(item).__name__}.")
        result.append(item)
    return result


_DEFAULT_TOP_K = GenerationConfig().top_k  # 50 on transformers 4.x, None (unset) from 5.0 on


def _sets_top_k(config: GenerationConfig) -> bool:
    """Whether `config` sets `top_k` itself: on transformers 4.x a config holds HF's default 50 whether or not
    anyone set it, so there only another value counts as set."""
    return config.top_k is not None and config.top_k != _DEFAULT_TOP_K
