"""One call of SGLang's custom logit processor: the rows of the requests that name it, processed by hfbridge.

SGLang calls the processor with the logits of the rows whose requests name it (`(rows, vocab)`, a
copy it writes back) and one `custom_params` dict per row, in which `"__req__"` is the request
(`rid`, `origin_input_ids`, `output_ids`, `sampling_params`, `eos_token_ids`, `tokenizer`). It may
make a new processor instance for every batch, so everything kept between calls lives in one
`Requests` store per process (the processor class holds it), keyed by request id:

- each request's checked options (checked once, at its first step);
- `Sampler`s shared by requests with equal options (and equal stop ids, and for options that count from
  the end of the prompt, equal prompt lengths), kept while one of those requests is. Requests with a state
  (mirostat, adaptive-p) share one too: it is called on all their rows at once, each row told which row of
  the last call it continues (`follow`: the same request id, one token longer; else a new state), and it
  reads each row's last token only; if that call fails, every request of it fails (as `hfbridge.vllm`);
- a `Sampler` of its own for a request whose options draw random numbers (XTC, seeded with SGLang's
  `sampling_seed`) or keep a state only its tokens can follow (the thinking budget, or a state beside
  options that read the histories), which follows that request whatever its row.

Rows with equal options run in one `Sampler.process` call: their histories are left-padded to one width
with an id one past the vocabulary, whose score column (added for the call, then dropped) is `-inf`,
so the padding never matches and is never chosen (as `hfbridge.vllm` does); rows whose options count
from the prompt share a call with rows of the same prompt and output lengths. A request whose options
fail (a bad option, a token id outside the vocabulary, string breakers without a tokenizer) is handed
to `fail(request, message)` and its row left as it is; requests gone from SGLang are forgotten.

>>> import torch
>>> from types import SimpleNamespace
>>> params = SimpleNamespace(temperature=1.0, top_k=1, top_p=1.0, min_p=0.0, frequency_penalty=0.0,
...                          presence_penalty=0.0, repetition_penalty=1.0, min_new_tokens=0, sampling_seed=None)
>>> req = SimpleNamespace(rid="a", origin_input_ids=[3, 3], output_ids=[], sampling_params=params,
...                       eos_token_ids={2}, tokenizer=None)
>>> Requests().process(torch.zeros(1, 4), [{"suppress_tokens": [1], "__req__": req}]).tolist()
[[0.0, -inf, 0.0, 0.0]]
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hfbridge._step.checks.caller_inputs import reads_ids
from hfbridge._step.checks.option_checks import check_token_ids_in_vocab
from hfbridge._step.run.sampler import Sampler
from hfbridge._step.run.stateful_members import continued_row, follow_rows, followed_by_caller, stateful_members
from hfbridge.processors._cpu_side import owned_scores
from hfbridge.sglang._custom_params import RequestOptions, build_sampler, check_params

__all__ = ["Requests"]

@dataclasses.dataclass
class _Request:
    request: RequestOptions | None  # None: failed
    handle: Any  # SGLang's `Req` (a weak proxy), to notice it is gone
    own: Sampler | None = None  # a stateful or random request's own sampler
    shared: tuple | None = None  # the key of its shared sampler


class Requests:
    """What the processor keeps between calls, per request id (see the module).

    Args:
        fail: Called with (the request, the message) for a request whose options fail; default: raise
            the error (the processor ends the request instead).
    """

    def __init__(self, fail: Callable[[Any, str], None] | None = None):
        self._requests: dict[Any, _Request] = {}
        self._shared: dict[tuple, Sampler] = {}
        # key of a shared Sampler with a state -> {request id: (row in its last call, length then)}
        self._followed: dict[tuple, dict[Any, tuple[int, int]]] = {}
        self._fail = fail

    def process(self, logits: torch.Tensor, params: Sequence[dict[str, Any] | None]) -> torch.Tensor:
        """`logits` `(rows, vocab)`, one `custom_params` per row: hfbridge's scores in the rows of requests
        with options (written into `logits`, which is returned); the other rows untouched."""
        if len(params) != logits.shape[0]:
            raise ValueError(f"{logits.shape[0]} rows of logits and {len(params)} `custom_params`: one per row.")
        self._forget_gone()
        groups: dict[Any, list[tuple[int, Any, _Request]]] = {}
        seen: set[int] = set()
        for row, custom in enumerate(params):
            req = (custom or {}).get("__req__")
            if req is None:
                if custom and any(not str(name).startswith("__") for name in custom):
                    raise ValueError("`custom_params` without `__req__`: hfbridge reads the request's tokens from "
                                     "it (SGLang adds it when the server runs with --enable-custom-logit-processor).")
                continue
            if id(req) in seen:
                raise ValueError("one request in several rows of one call (speculative decoding): hfbridge's "
                                 "processor reads one history per request; serve without speculative decoding.")
            seen.add(id(req))
            entry = self._entry(custom or {}, req, logits.shape[1], logits.device)
            if entry.request is None:
                continue
            key = ("own", row) if entry.own is not None else self._group_key(entry, req)
            groups.setdefault(key, []).append((row, req, entry))
        for members in groups.values():
            self._run(logits, members)
        return logits

    # -- requests ---------------------------------------------------------------------------------

    def _entry(self, custom: dict[str, Any], req: Any, vocab: int, device: torch.device) -> _Request:
        rid = req.rid
        entry = self._requests.get(rid)
        if entry is not None:
            return entry
        entry = _Request(None, req)
        self._requests[rid] = entry
        try:
            request = check_params(custom, req.sampling_params)
            if request is None:
                return entry
            check_token_ids_in_vocab(request.options, vocab)
            self._attach(entry, request, req, device)
        except (TypeError, ValueError) as error:
            entry.request = None
            self._failed(req, str(error))
        return entry

    def _attach(self, entry: _Request, request: RequestOptions, req: Any, device: torch.device) -> None:
        eos = None
        if request.needs_eos and "eos_token_id" not in request.options:
            stops = set(getattr(req, "eos_token_ids", None) or ()) | set(req.sampling_params.stop_token_ids or ())
            eos = sorted(stops) or None
        tokenizer = getattr(req, "tokenizer", None) if request.string_breakers else None
        if request.string_breakers and tokenizer is None:
            raise ValueError("`dry_sequence_breakers` holds strings, which need the model's tokenizer, and the "
                             "request has none (the server skips its tokenizer); pass token-id sequences instead.")
        prompt_length = len(req.origin_input_ids)
        key = (request.key, None if eos is None else tuple(eos), prompt_length if request.counts_from_prompt else None)
        own = request.random or (request.stateful and request.counts_from_prompt)
        if not own and key not in self._shared:
            sampler = build_sampler(request, prompt_length=key[2], eos_token_id=eos, tokenizer=tokenizer,
                                    generator=None)
            stateful = bool(stateful_members(sampler.processors))
            own = stateful and not followed_by_caller(sampler.processors)  # a thinking budget: its own
            if not own:
                self._shared[key] = sampler
                if stateful:
                    self._followed[key] = {}
        if own:
            seed = getattr(req.sampling_params, "sampling_seed", None)
            generator = None
            if request.random:
                seed = seed if seed is not None else zlib.crc32(request.key.encode())
                generator = torch.Generator(device=device).manual_seed(seed % (2**63))
            entry.own = build_sampler(request, prompt_length=prompt_length, eos_token_id=eos, tokenizer=tokenizer,
                                      generator=generator)
        else:
            entry.shared = key
        entry.request = request

    def _group_key(self, entry: _Request, req: Any) -> Any:
        assert entry.request is not None
        if entry.request.counts_from_prompt:
            return (entry.shared, len(req.output_ids))
        return entry.shared

    def _forget_gone(self) -> None:
        for rid, entry in list(self._requests.items()):
            try:
                gone = bool(entry.handle.finished()) if hasattr(entry.handle, "finished") else False
            except ReferenceError:  # SGLang's weak proxy of a request that no longer exists
                gone = True
            if gone:
                del self._requests[rid]
        used = {entry.shared for entry in self._requests.values()}
        for key in [key for key in self._shared if key not in used]:  # no request of these options is left
            del self._shared[key]
            self._followed.pop(key, None)

    def _failed(self, req: Any, message: str) -> None:
        if self._fail is None:
            raise ValueError(message)
        self._fail(req, message)

    # -- one step ---------------------------------------------------------------------------------

    def _run(self, logits: torch.Tensor, members: list[tuple[int, Any, _Request]]) -> None:
        first = members[0][2]
        sampler = first.own if first.own is not None else self._shared[first.shared]  # type: ignore[index]
        vocab = logits.shape[1]
        rows = [row for row, _, _ in members]
        scores = logits[rows].float()  # [G, V] a copy: processors may write into it
        histories: list[torch.Tensor] = []
        followed = self._followed.get(first.shared) if first.own is None else None  # type: ignore[arg-type]
        if followed is not None:
            sources = [continued_row(followed.get(req.rid), _length(req)) for _, req, _ in members]
            follow_rows(sampler.processors, sources, logits.device)
            last = [(req.output_ids or req.origin_input_ids)[-1] for _, req, _ in members]  # all the chain reads
            histories = list(torch.tensor(last, dtype=torch.long, device=logits.device)[:, None])  # each [1]
        elif reads_ids(sampler.processors):
            histories = [_history(req, logits.device) for _, req, _ in members]
        padded = len({len(history) for history in histories}) > 1
        if not histories:  # a chain that never reads the ids gets none
            ids = torch.empty(len(rows), 0, dtype=torch.long, device=logits.device)  # [G, 0]
        elif padded:  # left padding with id V, whose column is -inf, dropped after the call
            scores = torch.cat([scores, scores.new_full((len(rows), 1), float("-inf"))], dim=1)  # [G, V + 1]
            ids = torch.nn.utils.rnn.pad_sequence(histories, batch_first=True, padding_value=vocab,
                                                  padding_side="left")  # [G, T]
        else:
            ids = torch.stack(histories)  # [G, T]
        try:
            with owned_scores():  # `scores` is this call's copy: hfbridge's processors may write into it
                processed = sampler.process(ids, scores)[:, :vocab]  # [G, V]
        except Exception as error:
            if len(members) == 1 or followed is not None:
                reason = f"hfbridge's chain failed at this step: {error}"
                if followed is not None:  # a shared state: the call may have updated some rows and not others
                    self._followed[first.shared] = {}  # type: ignore[index]
                    if len(members) > 1:
                        reason += f" (a chain with a state, shared by {len(members)} requests: every one of them ends)"
                for _, req, entry in members:
                    entry.request = None
                    self._failed(req, reason)
                return
            for member in members:  # find the request at fault; the others still get their scores
                self._run(logits, [member])
            return
        logits[rows] = processed.to(logits.dtype)
        if followed is not None:
            self._followed[first.shared] = {req.rid: (position, _length(req))  # type: ignore[index]
                                            for position, (_, req, _) in enumerate(members)}


def _length(req: Any) -> int:
    """The request's tokens so far, prompt included."""
    return len(req.origin_input_ids) + len(req.output_ids)


def _history(req: Any, device: torch.device) -> torch.Tensor:
    """`(length,)` the request's prompt and output ids (SGLang keeps them as lists or `array("q")`)."""
    prompt, output = req.origin_input_ids, req.output_ids
    return torch.tensor([*prompt, *output], dtype=torch.long, device=device)

