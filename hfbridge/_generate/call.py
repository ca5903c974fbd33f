"""One `generate` call's preparation: the arguments checked, HF's config, criteria and processors built.

`prepare` runs steps 1-4 of `generate` (see `hfbridge._generate.generate`) and returns a `Call`;
`decode` runs step 5, the one-token loop. The hosts of HF's own loops (`hf_loops/`) use them too,
which is why they live below the public `generate` module.

>>> import torch
>>> from hfbridge._generate.options import GenerateOptions
>>> from hfbridge._models.choose import as_adapter
>>> adapter = as_adapter(lambda ids: torch.nn.functional.one_hot(ids % 3, 3).float())
>>> call = prepare(adapter, torch.tensor([[0, 1]]), GenerateOptions(kwargs={"max_new_tokens": 2}))
>>> decode(adapter, call, streamer=None, bar=None)
>>> call.sequences.tolist()
[[0, 1, 1, 1]]
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from transformers import GenerationConfig, StoppingCriteriaList, TextStreamer

from hfbridge._generate.args import check_config, checked_arguments, has_default_max_length
from hfbridge._generate.banned_loop import BannedLoop, check_adapter, make_bans, split_banned
from hfbridge._generate.guidance import split_guidance, unconditional_branch
from hfbridge._generate.hf_loops.beam import check_beam_options
from hfbridge._generate.loop import LoopOptions, pads_finished
from hfbridge._generate.loop import decode as loop_decode
from hfbridge._generate.modes import is_assisted, is_beam
from hfbridge._generate.options import GenerateOptions
from hfbridge._hf.host import ProcessorHost, generation_option_names, special_token
from hfbridge._models.adapters import ModelAdapter
from hfbridge._models.hf_model import HFModel
from hfbridge._step.build_processors import callable_list, make_generation_config
from hfbridge._step.per_row import PerRowValues, split_per_row
from hfbridge._step.sampler import Sampler


@dataclasses.dataclass
class Call:
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
    # The user's own processors, prefix_allowed_tokens_fn or stopping criteria run at every step:
    # they may keep state, so the loop stops where HF stops (see `LoopOptions.check_every`).
    user_code: bool = False
    banned: BannedLoop | None = None  # banned strings and patterns (`banned_loop.py`)


def prepare(adapter: ModelAdapter, input_ids: Any, options: GenerateOptions) -> Call:
    """Steps 1-4: check every argument and build the call's config, criteria, sampler and state."""
    generation_config, streamer, generator = options.generation_config, options.streamer, options.generator
    tokenizer, fast, assistant_model = options.tokenizer, options.fast, options.assistant_model
    # 1. Arguments, and `**kwargs` split into generation options and model inputs (and guidance's inputs).
    kwargs, guidance = split_guidance(options.kwargs)
    kwargs, banned_options = split_banned(kwargs)  # banned_strings / banned_regex (`banned_loop.py`)
    kwargs, per_row = split_per_row(kwargs)  # one value per prompt (`_step/per_row.py`)
    attention_mask, config_options, model_inputs, layout = checked_arguments(
        adapter, input_ids, attention_mask=options.attention_mask, generation_config=generation_config,
        streamer=streamer, generator=generator, layout=options.layout, fast=fast, kwargs=kwargs)
    batch, prompt_length = input_ids.shape
    device = input_ids.device

    # 2. The config, exactly as HF's `generate` prepares it (defaults, lengths, validation, special tokens).
    do_sample = config_options.pop("do_sample", None)
    # An HF model's own generation_config supplies the defaults, merged by HF's code (`HFModel.host`).
    host = adapter.host(device) if isinstance(adapter, HFModel) else ProcessorHost(device=device)
    config = make_generation_config(generation_config, do_sample=do_sample, prompt_length=prompt_length,
                                    accepted=generation_option_names(), caller="generate", host=host,
                                    **config_options)
    check_config(config, tokenizer, assistant_model)
    if is_beam(config):
        check_beam_options(config, adapter, streamer=streamer, generator=generator, fast=fast)
    host.prepare_special_tokens(config, attention_mask is not None, device, batch_size=batch)
    if attention_mask is None:
        attention_mask = host.attention_mask(input_ids, config)
    if batch > 1 and bool((attention_mask[:, -1] == 0).any()):
        warnings.warn(
            "`attention_mask` has padding at the end of some rows (right padding); decoder-only models need "
            "left padding for batched generation (tokenizer padding_side='left').",
            UserWarning,
            stacklevel=3,
        )
    default_max_length = has_default_max_length(config_options, generation_config)
    host.validate_length(config, prompt_length, default_max_length)

    # 3. One row per returned sequence (per beam for beam search), as HF's `_expand_inputs_for_generation`.
    expand = config.num_beams if is_beam(config) else (config.num_return_sequences or 1)
    per_row = check_rows_of_call(per_row, generator, batch=batch, expand=expand,
                                 strategy="beam search" if is_beam(config) else "assisted decoding"
                                 if is_assisted(config, assistant_model) else None)
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
    if pads_finished(criteria) and special_token(config, "pad") is None:
        raise ValueError(
            "a stopping criterion has an `eos_token_id`, so finished rows need a `pad_token_id`; pass "
            "pad_token_id= (or eos_token_id=, which HF then uses as the pad token)."
        )
    padding = mask if bool((mask == 0).any()) else None  # HF drops an all-ones mask before building processors
    # guidance_scale: the unconditional sequence through the adapter, with its own state (`guidance.py`)
    unconditional = unconditional_branch(adapter, config, guidance, input_ids=input_ids, expand=expand,
                                         model_inputs=model_inputs, assistant_model=assistant_model)
    sampler = Sampler.from_prepared(config, processors=options.processors, layout=layout,
                                    vocab_size=options.vocab_size, generator=generator, prompt_length=prompt_length,
                                    attention_mask=padding, fast=fast,
                                    prefix_allowed_tokens_fn=options.prefix_allowed_tokens_fn,
                                    unconditional=unconditional, tokenizer=tokenizer,
                                    per_row=per_row)
    refused = ("beam search" if is_beam(config) else "assisted decoding" if is_assisted(config, assistant_model)
               else "classifier-free guidance (guidance_scale)" if unconditional is not None else None)
    bans = make_bans(banned_options, tokenizer, strategy=refused)
    banned = None
    if bans is not None:
        check_adapter(adapter)
        banned = BannedLoop(bans, rows=batch * expand, prompt_length=prompt_length, streamer=streamer,
                            generator=generator)
    state = adapter.start(sequences, mask, model_inputs)
    if isinstance(adapter, HFModel):  # its first cache and logits_to_keep depend on the prepared config
        state = adapter.begin(state, config, prompts=batch, assisted=is_assisted(config, assistant_model),
                              rollback=bans is not None)
    return_dict = bool(config.return_dict_in_generate)
    return Call(config=config, sampler=sampler, criteria=criteria, sequences=sequences, mask=mask, state=state,
                 prompts=batch, expand=expand,
                 scores=() if return_dict and config.output_scores else None,
                 raw_logits=() if return_dict and config.output_logits else None,
                 user_code=(bool(options.processors) or options.prefix_allowed_tokens_fn is not None
                           or bool(options.stopping_criteria)), banned=banned)


def decode(adapter: ModelAdapter, call: Call, streamer: Any, bar: Any, loop: LoopOptions | None = None) -> None:
    """Step 5, the loop of HF's `_sample` (`_generate/loop.py`), in place on `call`."""
    loop_decode(adapter, call, streamer, bar, loop or LoopOptions())


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
                       strategy: str | None) -> PerRowValues | None:
    """Per-row options (one per prompt) expanded to the call's rows; a generator list has one per row."""
    rows = batch * expand
    if strategy is not None and (per_row is not None or isinstance(generator, (list, tuple))):
        what = f"`{next(iter(per_row.values))}` per row" if per_row is not None else "a list of generators"
        raise ValueError(f"generate(): {what} works with greedy decoding and sampling, not with {strategy}; "
                         "pass a single value (and a single generator).")
    if isinstance(generator, (list, tuple)) and len(generator) != rows:
        raise ValueError(
            f"`generator` is a list of {len(generator)} generators, but generate() makes {rows} rows ({batch} "
            f"prompts x {expand} sequences each); pass one generator per returned sequence, row i of the output "
            "drawn from generator i."
        )
    if per_row is None:
        return None
    per_row.check_rows(batch, what="`input_ids` has")
    return per_row.expanded(expand) if expand > 1 else per_row
