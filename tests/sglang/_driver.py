"""A driver that runs requests the way SGLang's scheduler and sampler run a custom logit processor.

What it mirrors (read from SGLang 0.5.23: `managers/schedule_batch.py`'s `Req`,
`sampling/sampling_batch_info.py`, `layers/sampler.py`'s `apply_custom_logit_processor`):

- each request carries `rid`, `origin_input_ids` (a list), `output_ids` (an `array("q")`, appended after
  each step), `sampling_params` (greedy: `temperature=1`, `top_k=1`; sampling: `temperature=1`, the whole
  vocabulary), `eos_token_ids`, `tokenizer`, `to_finish`; its `custom_params` gets `"__req__"`, a weak proxy
  of the request;
- each step, the batch is the unfinished requests (in an order that changes from step to step); the rows of
  the requests that name the processor are selected (`index_select`), the processor is made anew from its
  string (`from_str`, a new instance per batch) and called with those rows and their `custom_params`, and
  its result is copied back (`index_copy_`);
- then SGLang chooses: the argmax for `top_k=1`, else a draw from the softmax (here one generator per
  request, as `hfbridge.generate(generator=[...])` draws, so that tokens can be compared).

The model is any `ids (1, T) -> logits (1, T, V)` callable, run on each request's whole sequence.
"""

from __future__ import annotations

import weakref
from array import array
from types import SimpleNamespace

import torch

TOP_K_ALL = 1 << 30


class Req:
    """The fields of SGLang's `Req` a custom logit processor reads."""

    def __init__(self, rid, prompt, custom_params, *, greedy=True, eos=(), tokenizer=None, seed=None,
                 sampling_params=None, **fields):
        self.rid = rid
        self.origin_input_ids = list(prompt)
        self.output_ids = array("q")
        values = dict(temperature=1.0, top_k=1 if greedy else TOP_K_ALL, top_p=1.0, min_p=0.0,
                      frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0, min_new_tokens=0,
                      sampling_seed=seed, stop_token_ids=None) | fields
        self.sampling_params = sampling_params if sampling_params is not None else SimpleNamespace(**values)
        self.eos_token_ids = set(eos)
        self.tokenizer = tokenizer
        self.to_finish = None
        self.finished_reason = None
        self.custom_params = None if custom_params is None else dict(custom_params) | {"__req__": weakref.proxy(self)}

    def finished(self):
        return self.finished_reason is not None


def run(model, requests, make_processor, *, steps, generators=None, shuffle=True):
    """Decode `steps` tokens for every request (fewer where one ends); returns each request's output ids.

    `make_processor()` is called once per step (a fresh instance, as SGLang may make one per batch).
    `generators`: one `torch.Generator` per request for its draws (sampling requests).
    """
    order = torch.Generator().manual_seed(1234)
    for _ in range(steps):
        live = [index for index, req in enumerate(requests) if not req.finished()]
        if not live:
            break
        if shuffle:
            live = [live[i] for i in torch.randperm(len(live), generator=order).tolist()]
        logits = torch.cat([model(torch.tensor([[*requests[i].origin_input_ids, *requests[i].output_ids]]))[:, -1]
                            for i in live])  # [B, V]
        rows = [row for row, index in enumerate(live) if requests[index].custom_params is not None]
        if rows:
            indices = torch.tensor(rows)
            selected = logits.index_select(0, indices)
            result = make_processor()(selected, [requests[live[row]].custom_params for row in rows])
            assert result.shape == selected.shape
            logits.index_copy_(0, indices, result.to(logits.dtype))
        for row, index in enumerate(live):
            req = requests[index]
            if req.to_finish is not None:
                req.finished_reason, req.to_finish = req.to_finish, None
                continue
            if req.sampling_params.top_k == 1:
                token = int(logits[row].argmax())
            else:
                probs = torch.softmax(logits[row].float(), dim=-1)
                token = int(torch.multinomial(probs, 1, generator=generators[index] if generators else None))
            req.output_ids.append(token)
            if token in req.eos_token_ids:
                req.finished_reason = "eos"
    return [list(req.output_ids) for req in requests]
