"""Scoring: the log-probability of each continuation, and whether greedy decoding would produce it.

`loglikelihood_tokens` is HFLM's `_loglikelihood_tokens` for a decoder-only model: lm-eval's
`Collator` sorts the requests longest first (and, with `logits_cache`, scores the one-token
continuations of one context with one row); each request becomes `(context + continuation)`
without its last token, truncated from the left to `max_length`; a batch is right-padded with 0
and run through the model once; the continuation's positions are read from each row. HFLM takes
`log_softmax` of the whole batch in the model's dtype; this takes it of the continuation's rows in
float32 (hfbridge's step works in float32 too), which equals HFLM's for a float32 model.

`ModelScorer` makes the one forward pass for any model form: a plain callable (or a
`PreTrainedModel`) is called as `Recompute` calls it, an adapter through its own
`start` / `forward` / `logits` with a mask of ones (right padding comes after every scored
position, so a causal model never sees it); the logits are read as `generate` reads them (a tensor,
the first item of a tuple or list, `"logits"` of a mapping, `.logits`), laid out by `layout` and
cut to `vocab_size`.

>>> import torch
>>> scorer = ModelScorer(lambda ids: torch.zeros(ids.shape[1], ids.shape[0], 5), layout="t b v", vocab_size=4)
>>> scorer.logits(torch.tensor([[1, 2, 3]])).shape
torch.Size([1, 3, 4])
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from einops import rearrange
from lm_eval.models.utils import Collator
from tqdm import tqdm

from hfbridge import Layout, ModelAdapter, Recompute

__all__ = ["ModelScorer", "loglikelihood_tokens"]

_log = logging.getLogger(__name__)
Request = tuple[Any, list[int], list[int]]  # ((context, continuation) or None, context ids, continuation ids)


class ModelScorer:
    """One forward pass over `(batch, seq)` token ids, returning logits `(batch, seq, vocab)`.

    Args:
        model: Any model form `hfbridge.generate` takes.
        layout: The logits' layout when not `"b t v"`; it must have a sequence axis `t` and one batch axis.
        vocab_size: The real vocabulary when the model's output is padded (the extra columns are dropped).
    """

    def __init__(self, model: Any, *, layout: Any = None, vocab_size: int | None = None):
        self.adapter = model if isinstance(model, ModelAdapter) else Recompute(model)
        self.layout = None if layout is None else layout if isinstance(layout, Layout) else Layout(layout)
        if self.layout is not None and (not self.layout.has_seq or len(self.layout.batch_axes) != 1):
            raise ValueError(f"scoring needs the logits of every position of every row: `layout` must have a sequence "
                             f"axis 't' and one batch axis, got {self.layout.pattern!r}.")
        if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
                                       or vocab_size < 1):
            raise ValueError(f"`vocab_size` must be a positive int, got {vocab_size!r}.")
        self.vocab_size = vocab_size

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The model's logits for `input_ids` `(batch, seq)`: `(batch, seq', vocab)`, `seq'` as the model returns."""
        state = self.adapter.start(input_ids, torch.ones_like(input_ids), {})
        with torch.no_grad():
            output = self.adapter.logits(self.adapter.forward(input_ids, state))
        logits = _read_logits(output)
        layout = self.layout or Layout.for_tensor(logits)
        layout.check(logits)
        if not layout.has_seq or len(layout.batch_axes) != 1:
            raise ValueError(f"scoring needs logits (batch, seq, vocab), got shape {tuple(logits.shape)}; pass "
                             "`layout=` (e.g. 't b v') for another order.")
        batch = layout.batch_axes[0]
        logits = rearrange(logits, f"{layout.pattern} -> {batch} t v")  # [B, T, V]
        if logits.shape[0] != input_ids.shape[0]:
            raise ValueError(f"the model returned logits for {logits.shape[0]} rows, but was given "
                             f"{input_ids.shape[0]} (input_ids of shape {tuple(input_ids.shape)}).")
        if self.vocab_size is not None:
            if self.vocab_size > logits.shape[-1]:
                raise ValueError(f"`vocab_size`={self.vocab_size} exceeds the logits' {logits.shape[-1]} columns.")
            logits = logits[..., :self.vocab_size]
        return logits


def _read_logits(output: Any) -> torch.Tensor:
    logits = output
    if isinstance(output, Mapping):
        logits = output.get("logits")
    elif not isinstance(output, torch.Tensor) and hasattr(output, "logits"):
        logits = output.logits
    elif isinstance(output, (tuple, list)) and output:
        logits = output[0]
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError("the model must return floating-point logits: a tensor, a tuple/list whose first element is "
                        f"one, a mapping with 'logits' or an object with `.logits`; got {type(output).__name__}.")
    return logits


def loglikelihood_tokens(lm: Any, requests: list[Request], *, batch_size: int,
                         disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    """`(log-probability, is_greedy)` per request, in the order of `requests` (HFLM's `_loglikelihood_tokens`)."""
    max_length = lm.max_length

    def longest_first(request: Request) -> tuple[int, tuple[int, ...]]:
        tokens = request[1] + request[2]
        return -len(tokens), tuple(tokens)

    def same_logits(request: Request) -> list[int]:  # requests that one forward pass scores together
        return request[-2] + request[-1][:-1]

    order = Collator(requests, sort_fn=longest_first, group_by="contexts" if lm.logits_cache else None,
                     group_fn=same_logits)
    results: list[tuple[float, bool]] = []
    bar = tqdm(total=len(requests), disable=disable_tqdm, desc="Running loglikelihood requests")
    for chunk in order.get_batched(n=batch_size):
        inputs, input_lengths = [], []
        for _, context, continuation in chunk:
            _check_request(context, continuation, max_length)
            if len(context) + len(continuation) > max_length + 1:
                _log.warning("Combined length of context (%d) and continuation (%d) exceeds model's maximum length "
                             "(%d). Truncating %d tokens from the left.", len(context), len(continuation),
                             max_length, len(context) + len(continuation) - max_length + 1)
            tokens = (context + continuation)[-(max_length + 1):][:-1]
            inputs.append(tokens)
            input_lengths.append(len(tokens))
        width = max(input_lengths)
        batch = torch.zeros((len(inputs), width), dtype=torch.long)  # [B, W], right-padded with 0 as HFLM
        for row, tokens in enumerate(inputs):
            batch[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        logits = lm.scorer.logits(batch.to(lm.device))  # [B, T, V]
        if logits.shape[1] < width:
            raise ValueError(f"the model returned logits for {logits.shape[1]} positions, but was fed {width}; "
                             f"lower `max_length` (now {max_length}) to the model's context window.")
        found: list[tuple[Any, torch.Tensor, torch.Tensor]] = []  # (request strings, log-probability, is greedy)
        for (strings, context, continuation), row_logits, length in zip(chunk, logits, input_lengths):
            end = length + logits.shape[1] - width  # HFLM's: extra leading positions (virtual tokens) shift the end
            logprobs = torch.log_softmax(row_logits[end - len(continuation):end].float(), dim=-1)[None]  # [1, C, V]
            greedy = logprobs.argmax(dim=-1)  # [1, C]
            for request_strings, tokens, cached in order.get_cache(req_str=strings, cxt_toks=context,
                                                                   cont_toks=continuation, logits=logprobs):
                wanted = torch.tensor(tokens, dtype=torch.long, device=cached.device)[None]  # [1, C']
                is_greedy = (greedy[:, -wanted.shape[1]:] == wanted).all()
                logprob = torch.gather(cached, 2, wanted[..., None]).sum()
                found.append((request_strings, logprob, is_greedy))
        values = torch.stack([torch.stack([logprob, flag.float()]) for _, logprob, flag in found]).tolist()  # one read
        for (request_strings, _, _), (logprob, flag) in zip(found, values):
            answer = (float(logprob), bool(flag))
            results.append(answer)
            if request_strings is not None:
                lm.cache_hook.add_partial("loglikelihood", request_strings, answer)
            bar.update(1)
    bar.close()
    return order.get_original(results)


def _check_request(context: list[int], continuation: list[int], max_length: int) -> None:
    if not context:
        raise ValueError("a loglikelihood request has no context tokens (lm-eval replaces an empty context with "
                         "the prefix token; check `prefix_token_id` and the tokenizer's bos/eos).")
    if not continuation:
        raise ValueError("a loglikelihood request has no continuation tokens: its continuation text encodes to "
                         "nothing.")
    if len(continuation) > max_length:
        raise ValueError(f"a continuation of {len(continuation)} tokens is longer than `max_length`={max_length}.")
