"""One `generate` call's preparation: the arguments checked, HF's config, criteria and processors built.

`prepare` runs steps 1-4 of `generate` (see `hfbridge._generate.generate`) and returns a `Call`;
`loop.decode` runs step 5, the one-token loop. The hosts of HF's own loops (`hf_loops/`) use them too,
which is why they live below the public `generate` module.

>>> import torch
>>> from hfbridge._generate.loop import LoopOptions, decode
>>> from hfbridge._generate.options import GenerateOptions
>>> from hfbridge._models.choose import as_adapter
>>> adapter = as_adapter(lambda ids: torch.nn.functional.one_hot(ids % 3, 3).float())
>>> call = prepare(adapter, torch.tensor([[0, 1]]), GenerateOptions(kwargs={"max_new_tokens": 2}))
>>> decode(adapter, call, None, None, LoopOptions())
>>> call.sequences.tolist()
[[0, 1, 1, 1]]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList, TextStreamer

from hfbridge._generate.args import (
    check_carried_options,
    check_config,
    check_inferred_mask,
    checked_arguments,
    has_default_max_length,
)
from hfbridge._generate.banned_loop import OPTIONS as BANNED_OPTIONS
from hfbridge._generate.banned_loop import BannedLoop, check_adapter, make_bans, split_banned
from hfbridge._generate.modes import Strategy, strategy_of
from hfbridge._generate.options import GenerateOptions
from hfbridge._generate.prepared import Call
from hfbridge._generate.unconditional_branch import GUIDANCE_INPUTS, split_guidance, unconditional_branch
from hfbridge._hf.stand_in import ProcessorHost, generation_option_names, special_token
from hfbridge._models.adapters import ModelAdapter, check_padding_taken
from hfbridge._models.hf_model import HFModel
from hfbridge._step.checks.option_checks import per_row_from_config
from hfbridge._step.plan.build_processors import callable_list, make_generation_config
from hfbridge._step.plan.community_options import OPTIONS as COMMUNITY_OPTIONS
from hfbridge._step.plan.per_row import PerRowValues, split_per_row
from hfbridge._step.plan.phase_options import check_thinking_options, expand_thinking_options
from hfbridge._step.run.sampler import Sampler


def prepare(adapter: ModelAdapter, input_ids: Any, options: GenerateOptions,
            strategies: Mapping[str, Strategy] | None = None) -> Call:
    """Steps 1-4: check every argument and build the call's config, criteria, sampler and state.

    `strategies` is the strategy table (`strategies.STRATEGIES`); the mode the config selects is
    looked up there once, its row checks what it cannot honour and says how many rows a prompt
    becomes, and both travel on the call. Default: the one-token loop's modes only (the draft of
    assisted decoding), whose rows are never run from the call.
    """
    generation_config, streamer, generator = options.generation_config, options.streamer, options.generator
    tokenizer, fast, assistant_model = options.tokenizer, options.fast, options.assistant_model
    # 1. Arguments, and `**kwargs` split into generation options and model inputs (and guidance's inputs).
    # (a feature's module is entered only when the call asks for the feature)
    kwargs, banned_options = options.kwargs, None
    guidance: dict[str, Any] = {}
    if not kwargs.keys().isdisjoint(GUIDANCE_INPUTS):
        kwargs, guidance = split_guidance(kwargs)
    if not kwargs.keys().isdisjoint(BANNED_OPTIONS):
        kwargs, banned_options = split_banned(kwargs)  # banned_strings / banned_regex (`banned_loop.py`)
    # one value per prompt (`_step/plan/per_row.py`), a passed config's read as the keyword's
    kwargs, per_row = split_per_row(per_row_from_config(generation_config, kwargs))
    thinking = None  # by name; values when its samplers are built
    if options.thinking_options is not None:
        thinking = check_thinking_options(options.thinking_options)
    attention_mask, config_options, model_inputs, layout = checked_arguments(
        adapter, input_ids, attention_mask=options.attention_mask, generation_config=generation_config,
        streamer=streamer, generator=generator, layout=options.layout, fast=fast, kwargs=kwargs)
    user_processors = callable_list(options.processors, LogitsProcessorList, name="processors",
                                    contract="(input_ids, scores) -> scores")  # read once
    batch, prompt_length = input_ids.shape
    device = input_ids.device

    # 2. The config, exactly as HF's `generate` prepares it (defaults, lengths, validation, special tokens).
    do_sample = config_options.pop("do_sample", None)
    # An HF model's own generation_config supplies the defaults, merged by HF's code (`HFModel.host`).
    host = adapter.host(device) if isinstance(adapter, HFModel) else ProcessorHost(device=device)
    check_carried_options(host.generation_config, where="in the model's `generation_config`",
                          set_by_call=[*config_options, *(per_row.values if per_row is not None else ())])
    config = make_generation_config(generation_config, do_sample=do_sample, prompt_length=prompt_length,
                                    accepted=generation_option_names(), caller="generate", host=host,
                                    phased=thinking is not None, checked=True, **config_options)
    check_config(config, tokenizer)
    # The mode, decided once: its row of the strategy table checks what it cannot honour.
    mode, strategy = strategy_of(strategies if strategies is not None else ONE_TOKEN_LOOP, config, assistant_model)
    expand = strategy.rows_per_prompt(config)  # rows per prompt (num_beams for beam search)
    if strategy.check is not None:
        strategy.check(adapter, config, options, rows=batch * expand, model_inputs=model_inputs)
    host.prepare_special_tokens(config, attention_mask is not None, device, batch_size=batch)
    inferred = attention_mask is None
    if attention_mask is None:
        attention_mask = check_inferred_mask(host.attention_mask(input_ids, config), special_token(config, "pad"))
    check_padding_taken(adapter, attention_mask, inferred=inferred)  # a model without a mask parameter
    if batch > 1 and bool((attention_mask[:, -1] == 0).any()):
        warnings.warn(
            "`attention_mask` has padding at the end of some rows (right padding); decoder-only models need "
            "left padding for batched generation (tokenizer padding_side='left').",
            UserWarning,
            stacklevel=3,
        )
    default_max_length = has_default_max_length(config_options, generation_config)
    host.validate_length(config, prompt_length, default_max_length)

    if thinking is not None:
        check_phases(mode, strategy.name, config, fast)
    # 3. One row per returned sequence (per beam for beam search), as HF's `_expand_inputs_for_generation`.
    per_row = check_rows_of_call(per_row, generator, batch=batch, expand=expand, strategy=strategy, config=config)
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
    criteria = host.stopping_criteria(config, _criteria_list(options.stopping_criteria), tokenizer=tokenizer)
    pads_finished = any(hasattr(criterion, "eos_token_id") for criterion in criteria)  # has_eos_stopping_criteria
    if pads_finished and special_token(config, "pad") is None:
        raise ValueError(
            "a stopping criterion has an `eos_token_id`, so finished rows need a `pad_token_id`; pass "
            "pad_token_id= (or eos_token_id=, which HF then uses as the pad token)."
        )
    padding = mask if bool((mask == 0).any()) else None  # HF drops an all-ones mask before building processors
    # guidance_scale: the unconditional sequence through the adapter, with its own state (`unconditional_branch.py`)
    unconditional = None
    if guidance or getattr(config, "guidance_scale", None) is not None:
        unconditional = unconditional_branch(adapter, config, guidance, input_ids=input_ids, expand=expand,
                                             model_inputs=model_inputs, assisted=mode == ASSISTED)
    sampler = Sampler.from_prepared(config, processors=user_processors, layout=layout,
                                    vocab_size=options.vocab_size, generator=generator, prompt_length=prompt_length,
                                    attention_mask=padding, fast=fast,
                                    prefix_allowed_tokens_fn=options.prefix_allowed_tokens_fn,
                                    unconditional=unconditional, tokenizer=tokenizer,
                                    per_row=per_row, vocab_from_tokenizer=not isinstance(adapter, HFModel),
                                    thinking_options=(expand_thinking_options(thinking, batch, expand)
                                                      if thinking is not None else None),
                                    prepare_phase=lambda more: make_generation_config(
                                        generation_config, do_sample=more.pop("do_sample", do_sample),
                                        prompt_length=prompt_length, accepted=generation_option_names(),
                                        caller="generate", host=host, phased=True, **{**config_options, **more}))
    # banned strings: only a strategy whose runner rolls rows back takes them, and not with guidance
    refused = (strategy.name if not strategy.rolls_back else "classifier-free guidance (guidance_scale)"
               if unconditional is not None else None)
    bans = make_bans(banned_options, tokenizer, strategy=refused) if banned_options is not None else None
    if bans is not None and thinking is not None:
        raise ValueError("`thinking_options` with `banned_strings` / `banned_regex` is not supported: a ban rolls "
                         "rows back, which the phases' samplers do not follow yet; drop one of them.")
    banned = None
    if bans is not None:
        check_adapter(adapter)
        banned = BannedLoop(bans, rows=batch * expand, prompt_length=prompt_length, streamer=streamer,
                            generator=generator)
    state = adapter.start(sequences, mask, model_inputs)
    if isinstance(adapter, HFModel):  # its first cache and logits_to_keep depend on the prepared config
        state = adapter.begin(state, config, prompts=batch, assisted=mode == ASSISTED, rollback=bans is not None)
    return_dict = bool(config.return_dict_in_generate)
    return Call(config=config, sampler=sampler, criteria=criteria, sequences=sequences, mask=mask, state=state,
                prompts=batch, expand=expand,
                scores=() if return_dict and config.output_scores else None,
                raw_logits=() if return_dict and config.output_logits else None,
                user_code=(bool(user_processors) or options.prefix_allowed_tokens_fn is not None
                           or bool(options.stopping_criteria)),
                mode=mode, strategy=strategy if strategies is not None else None,
                user_processors=user_processors, unconditional=unconditional, banned=banned,
                pads_finished=pads_finished)


ASSISTED = "assisted_generation"
_LOOP = "greedy search and sampling"
# The one-token loop's own modes: the table of a call no runner runs (the draft of assisted decoding).
ONE_TOKEN_LOOP = {"greedy_search": Strategy(_LOOP, run=None, per_row=True),
                  "sample": Strategy(_LOOP, run=None, per_row=True)}


def check_phases(mode: str, strategy: str, config: GenerationConfig, fast: Any) -> None:
    """`thinking_options` runs in the one-token loop (greedy search and sampling), and keeps no fused scores."""
    if mode not in ONE_TOKEN_LOOP:
        raise ValueError(f"`thinking_options` works with greedy search and sampling, not with {strategy}: each "
                         "phase's sampler follows its own rows, which beams and drafts would move; drop "
                         "`thinking_options`, or decode without beams and assistants.")
    if fast is True and config.return_dict_in_generate and config.output_scores:
        raise ValueError("generate(): `output_scores=True` with `fast=True` and `thinking_options`: the fast path "
                         "keeps no processed scores; pass fast=False.")


def _criteria_list(stopping_criteria: Iterable[Callable] | None) -> StoppingCriteriaList:
    return callable_list(stopping_criteria, StoppingCriteriaList, name="stopping_criteria",
                         contract="(input_ids, scores) -> bool tensor (batch,)")


def _expand(value: Any, batch: int, expand: int) -> Any:
    if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == batch:
        return value.repeat_interleave(expand, dim=0)
    return value


def progress_bar(progress: bool, total: int) -> Any:
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


def check_rows_of_call(per_row: PerRowValues | None, generator: Any, *, batch: int, expand: int,
                       strategy: Strategy, config: GenerationConfig) -> PerRowValues | None:
    """Per-row options (one per prompt) expanded to the call's rows, as HF expands `input_ids`; a
    generator list has one per row. The community samplers' per-row values (on `config`) are expanded
    in place the same way; a strategy without per-row values refuses both kinds alike."""
    rows = batch * expand
    # the one per-row parser (`split_per_row`), on the values the config carries (keywords are split already)
    _, carried = split_per_row({name: getattr(config, name, None) for name, row in COMMUNITY_OPTIONS.items()
                                if row.per_row})
    community = carried.values if carried is not None else {}
    if not strategy.per_row and (per_row is not None or community or isinstance(generator, (list, tuple))):
        name = next(iter(per_row.values)) if per_row is not None else next(iter(community), None)
        what = f"`{name}` per row" if name is not None else "a list of generators"
        raise ValueError(f"generate(): {what} works with greedy decoding and sampling, not with {strategy.name}; "
                         "pass a single value (and a single generator).")
    if isinstance(generator, (list, tuple)) and len(generator) != rows:
        raise ValueError(
            f"`generator` is a list of {len(generator)} generators, but generate() makes {rows} rows ({batch} "
            f"prompts x {expand} sequences each); pass one generator per returned sequence, row i of the output "
            "drawn from generator i."
        )
    if per_row is not None:
        per_row.check_rows(batch, what="`input_ids` has")
    for name, values in community.items():
        PerRowValues(len(values), {name: values}).check_rows(batch, what="`input_ids` has")
    for name, values in community.items():
        if expand > 1:
            setattr(config, name, tuple(value for value in values for _ in range(expand)))
    if per_row is None:
        return None
    return per_row.expanded(expand) if expand > 1 else per_row
