"""`generate_until`: HFLM's `generate_until`, with `hfbridge.generate` as the decoding loop.

As HFLM: lm-eval's `Collator` groups the requests by their `gen_kwargs` and sorts each group
longest first; `normalize_gen_kwargs` reads `max_gen_toks` (or an alias) and `do_sample` /
`temperature`; the stop sequences are `until` plus the eos token's text; prompts are left-padded
and left-truncated to `max_length - max_gen_toks` tokens; a temperature of 0 (or none) without
`do_sample` is greedy; the new tokens are decoded without special tokens, cut at the first stop
sequence, and after `think_end_token` when one is set.

What differs: the stop sequences go to `generate` as HF's `stop_strings` (`StopStringCriteria`; HFLM
uses lm-eval's own criterion, which stops at the same text), and the options of the
`HFBridgeLM(...)` call (hfbridge's samplers, `fast=True`, ...) join each request's `gen_kwargs`,
which win. A model without a `generation_config` stops at the tokenizer's eos (an HF model stops
where its `generation_config` says, as in HFLM). A model that takes no attention mask (a plain
callable without an `attention_mask` parameter, `InputPos`) would attend to the left padding of a
batch, so its prompts of different lengths are generated apart, each length in one batch.

>>> import torch
>>> mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1]])     # three left-padded prompts
>>> _row_groups(mask, lambda input_ids: input_ids), _row_groups(mask, lambda input_ids, attention_mask: input_ids)
([[0, 2], [1]], [[0, 1, 2]])
"""

from __future__ import annotations

from typing import Any

import torch
from lm_eval.models.utils import Collator, handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

from hfbridge import InputPos, ModelAdapter, Recompute, ReturnsCache, generate

__all__ = ["generate_until"]


def generate_until(lm: Any, requests: list[Any], *, disable_tqdm: bool = False) -> list[str]:
    """The generated text of each request `(context, gen_kwargs)`, in the order of `requests`."""
    results: list[str] = []

    def longest_first(request: tuple[str, dict]) -> tuple[int, str]:
        return -len(lm.tok_encode(request[0])), request[0]

    order = Collator([request.args for request in requests], sort_fn=longest_first, group_by="gen_kwargs",
                     group_fn=lambda request: request[1])
    eos = lm.tok_decode(lm.eot_token_id, skip_special_tokens=False)
    bar = tqdm(total=len(requests), disable=disable_tqdm, desc="Running generate_until requests")
    for chunk in order.get_batched(n=lm.batch_size):
        contexts, all_kwargs = zip(*chunk)
        request_kwargs = all_kwargs[0]  # one group: every request of the chunk has the same gen_kwargs
        if not isinstance(request_kwargs, dict):
            raise TypeError("a generate_until request's gen_kwargs must be a dict, got "
                            f"{type(request_kwargs).__name__}.")
        kwargs = dict(normalize_gen_kwargs(request_kwargs, lm.max_gen_toks))
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        max_gen_toks = kwargs.pop("max_gen_toks")
        if max_gen_toks >= lm.max_length:
            raise ValueError(f"requested max tokens to generate ({max_gen_toks}) must be less than the model's maximum "
                             f"sequence length (max_length={lm.max_length}).")
        input_ids, attention_mask = lm.tok_batch_encode(list(contexts), left_truncate_len=lm.max_length - max_gen_toks,
                                                        truncation=lm.truncation)
        prompt = input_ids.shape[1]
        new_tokens = kwargs.pop("max_length", prompt + max_gen_toks) - prompt
        options = _options(lm, kwargs, until)
        generated: list[list[int]] = [[] for _ in contexts]
        for rows in _row_groups(attention_mask, lm.model):
            width = int(attention_mask[rows].sum(dim=1).max())  # the group's longest prompt: no column of padding only
            ids, mask = input_ids[rows, prompt - width:], attention_mask[rows, prompt - width:]
            sequences = generate(lm.model, ids.to(lm.device), attention_mask=mask.to(lm.device),
                                 max_new_tokens=new_tokens, **options)
            for row, tokens in zip(rows, sequences[:, width:].tolist()):
                generated[row] = tokens
        for tokens, context in zip(generated, contexts):
            text = _text(lm, tokens, until)
            results.append(text)
            lm.cache_hook.add_partial("generate_until", (context, request_kwargs), text)
            bar.update(1)
    bar.close()
    return order.get_original(results)


def _row_groups(attention_mask: torch.Tensor, model: Any) -> list[list[int]]:
    """The rows to generate together: all of them, or, for a model that takes no attention mask
    (it would attend to the left padding), the rows of each prompt length apart."""
    if _takes_mask(model) or bool(attention_mask.all()):
        return [list(range(attention_mask.shape[0]))]
    groups: dict[int, list[int]] = {}
    for row, length in enumerate(attention_mask.sum(dim=1).tolist()):
        groups.setdefault(length, []).append(row)
    return list(groups.values())


def _takes_mask(model: Any) -> bool:
    if isinstance(model, (Recompute, ReturnsCache)):
        return model.takes_mask
    if isinstance(model, InputPos):
        return False
    if isinstance(model, ModelAdapter) or getattr(model, "generation_config", None) is not None:
        return True  # your own adapter or Hooks decides; an HF model takes its mask
    return Recompute(model).takes_mask


def _options(lm: Any, kwargs: dict[str, Any], until: list[str]) -> dict[str, Any]:
    """The keyword options of one `generate` call: the defaults, then the request's, as HFLM's `_model_generate`."""
    options = {**lm.generate_defaults, **kwargs}
    options["temperature"] = options.get("temperature", 0.0)
    if options["temperature"] == 0.0 and options.get("do_sample") is None:
        options["do_sample"] = False
    if options.get("do_sample") is False and options["temperature"] == 0.0:
        del options["temperature"]  # greedy: HF would warn about a temperature it does not use
    stops = [*(options.pop("stop_strings", None) or ()), *until]
    stops = [stop for stop in dict.fromkeys(stops) if stop]  # an empty stop (eos decoding to '') never matches
    if stops:
        options["stop_strings"] = stops
        options["tokenizer"] = lm.tokenizer
    options.setdefault("pad_token_id", lm.pad_token_id)
    inner = lm.model.model if isinstance(lm.model, ModelAdapter) else lm.model
    if getattr(inner, "generation_config", None) is None and lm.eot_token_id is not None:
        options.setdefault("eos_token_id", lm.eot_token_id)
    return options


def _text(lm: Any, tokens: list[int], until: list[str]) -> str:
    """HFLM's post-processing: after the last `think_end_token` id, decoded, cut at the first stop sequence."""
    think = lm.think_end_token
    if isinstance(think, int) and think in tokens:
        tokens = tokens[len(tokens) - tokens[::-1].index(think):]
    text = lm.tok_decode(tokens)
    if isinstance(think, int):
        text = text.lstrip()
    return postprocess_generated_text(generation=text, stop=until,
                                      think_end_token=think if isinstance(think, str) else None)
