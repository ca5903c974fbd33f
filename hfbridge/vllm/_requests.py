"""The requests with hfbridge options that one vLLM processor holds, and one step over their rows.

Both of vLLM's runners hand a logits processor its requests under an index (the V1 runner: a row of
its persistent batch, which moves; Model Runner V2: a request slot, recycled without notice) and, at
each step, one logits row per running request. `Requests` keeps one `Row` per index (its checked
options, its prompt length, its stop ids, its share of a `Sampler` or a `Sampler` of its own) and
runs a step over the rows a runner names, one `Sampler.process` call per group of rows that share a
chain:

- rows with equal options share one `Sampler`; their histories are left-padded to one width with an
  id one past the vocabulary, whose score column (added for the call, then dropped) is `-inf`, so
  the padding is a token that never matches and is never chosen (every processor then sees each row
  as it would alone; `tests/vllm/test_batch.py` checks this per option);
- rows whose options count from the end of the prompt (`min_new_tokens`, presence/frequency
  penalties without `penalty_last_n`, ...) share a call with rows of the same prompt length and
  length so far, without padding, through a `Sampler` built for that prompt length;
- requests whose options keep a state across steps (mirostat, adaptive-p) share one `Sampler` too, called on
  all their rows at once (never in slices): before each call its stateful processors are told which row of
  the last call each row continues (`follow`: the same request, one token longer; else a new state), so each
  request keeps its own state wherever vLLM moves it. If that call fails, every request of it is ended (the
  states of the others are no longer known);
- a request that draws with its own `seed` (XTC), whose stateful options cannot be followed so (a thinking
  budget), or whose state counts from its prompt, has a `Sampler` of its own, which follows that one request.

The runners differ only in where a group's token ids come from (`_batch.Batch`: a `History` per
request; `_slots.Slots`: vLLM's own token buffer), which each passes to `Requests.run`. Rows without
hfbridge options are never touched. A request whose options fail in the worker (a token id outside
the vocabulary, no tokenizer for DRY's string breakers, an error inside the chain) is logged and
ended (its row allows only its stop tokens), so that the engine keeps serving the others.

>>> import torch
>>> from types import SimpleNamespace
>>> params = SimpleNamespace(extra_args={"hfbridge": {"suppress_tokens": [1]}}, temperature=0.0,
...                          all_stop_token_ids={2}, seed=None)
>>> requests = Requests(vocab_size=4)
>>> requests.add(7, params, prompt_length=2) is not None
True
>>> logits = torch.zeros(2, 4)
>>> requests.run(logits, [Entry(row=1, key=7, length=2)], lambda group, padded: torch.tensor([[3, 3]]))
>>> logits.tolist()
[[0.0, 0.0, 0.0, 0.0], [0.0, -inf, 0.0, 0.0]]
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import zlib
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, NamedTuple

import torch

from hfbridge._step.checks.caller_inputs import reads_ids
from hfbridge._step.checks.option_checks import check_token_ids_in_vocab
from hfbridge._step.run.sampler import Sampler
from hfbridge._step.run.stateful_members import continued_row, follow_rows, followed_by_caller, stateful_members
from hfbridge.processors._cpu_side import owned_scores
from hfbridge.vllm._sampling_params import RequestOptions, build_sampler, check_request

logger = logging.getLogger(__name__)

_CPU_CALL_SCORES = 1 << 19  # the most scores one chain call takes on a CPU (see `Requests.run`)


@dataclasses.dataclass
class Row:
    """One request with hfbridge options, under the index vLLM gave it."""

    request: RequestOptions
    prompt_length: int
    stop_ids: tuple[int, ...]
    history: Any = None  # the V1 runner's `History`; None under Model Runner V2 (vLLM's buffer holds it)
    shared: Hashable | None = None  # its key in `Requests._samplers`, when it shares a Sampler
    own: Sampler | None = None  # its own Sampler (seeded, or a state that cannot be followed)
    failed: str | None = None  # why the request is being ended
    serial: int = -1  # unique to this request in its `Requests` (a shared state follows it, not its index)


class Entry(NamedTuple):
    """One request's logits row at this step: `logits[row]`, the request under `key`, `length` tokens so far."""

    row: int
    key: int
    length: int


# `(group, padded) -> (rows, T)` ids: the group's histories, left-padded with id `vocab_size` when `padded`
# (else all of one length)
GroupIds = Callable[[Sequence[Entry], bool], torch.Tensor]


class Requests:
    """The requests of one vLLM processor that carry hfbridge options; see the module.

    Args:
        vocab_size: The width of vLLM's logits (the model's vocabulary).
        device: Where the logits are.
        seed: The engine's seed: the random samplers (XTC) of each set of options draw from a
            generator seeded from it, so every tensor-parallel worker draws the same numbers.
        tokenizer: `() -> tokenizer`, called once when a request first needs the tokenizer (DRY's
            string sequence breakers).
        default_eos: The model's end-of-sequence ids, for a request that reports no stop ids.
    """

    def __init__(self, *, vocab_size: int, device: torch.device | str = "cpu", seed: int = 0,
                 tokenizer: Callable[[], Any] | None = None, default_eos: Iterable[int] = ()):
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.seed = seed
        self._tokenizer_loader = tokenizer
        self._tokenizer: Any = None
        self._default_eos = tuple(default_eos)
        self.rows: dict[int, Row] = {}
        self._samplers: dict[Hashable, list[Any]] = {}  # key -> [Sampler, rows using it]
        # key of a shared Sampler with a state -> {serial: (row in its last call, length then)}
        self._followed: dict[Hashable, dict[int, tuple[int, int]]] = {}
        self._serials = itertools.count()
        self._buffer: torch.Tensor | None = None  # [R, V + 1] float32 scores, reused by every call

    # -- requests ---------------------------------------------------------------------------------

    def add(self, index: int, params: Any, prompt_length: int | None, *, refuse: str | None = None) -> Row | None:
        """A request arrives under `index` (what held it before is let go); its `Row`, or None without options.

        `prompt_length` None: the request has no prompt ids (prompt embeddings). `refuse`: why a request
        with options cannot run in this engine (it is then ended at its first step, and logged).
        """
        self.remove(index)
        failure: str | None = None
        try:
            request = check_request(params)
        except (TypeError, ValueError) as error:  # vLLM's front end checks this first; a direct call may not
            request, failure = None, str(error)
        if request is None and failure is None:
            return None
        stops = tuple(sorted(getattr(params, "all_stop_token_ids", None) or ())) or self._default_eos
        stops = tuple(token for token in stops if 0 <= token < self.vocab_size)
        if request is None or prompt_length is None or refuse is not None:
            placeholder = RequestOptions({}, False, "", False, False, False, False, False)
            row = Row(placeholder, prompt_length or 0, stops)
            self._fail_row(row, failure or refuse or "hfbridge options need the prompt's token ids (prompt "
                                                     "embeddings carry none)")
        else:
            row = Row(request, prompt_length, stops)
            try:
                self._attach(row, params)
            except Exception as error:
                self._fail_row(row, str(error))
        row.serial = next(self._serials)
        self.rows[index] = row
        return row

    def remove(self, index: int) -> None:
        """The request under `index` has left."""
        self._release(self.rows.pop(index, None))

    def move(self, source: int, target: int, swap: bool) -> None:
        """The request under `source` moves to `target` (and the one there to `source` when `swap`)."""
        first, second = self.rows.pop(source, None), self.rows.pop(target, None)
        if first is not None:
            self.rows[target] = first
        if swap and second is not None:
            self.rows[source] = second
        elif not swap:
            self._release(second)

    # -- one step ---------------------------------------------------------------------------------

    def run(self, logits: torch.Tensor, entries: Iterable[Entry], ids: GroupIds) -> None:
        """Process the `(rows, vocab)` `logits` rows of `entries` (requests with options) in place."""
        groups: dict[Hashable, list[Entry]] = {}
        for entry in entries:
            row = self.rows[entry.key]
            if row.failed is not None:
                key: Hashable = "failed"
            elif row.own is not None:
                key = ("own", entry.key)
            elif row.request.counts_from_prompt:
                key = (row.shared, entry.length)
            else:
                key = row.shared
            groups.setdefault(key, []).append(entry)
        # on a CPU, calls over more than ~2^19 scores run slower per row than smaller ones, and calls of a few rows
        # pay each call's fixed cost (32 requests, V=32000, thread CPU time of `Batch.apply`: 16 rows a call beat 4
        # and 32 for XTC, top-n-sigma, DRY and vLLM's six options, 2026-12-02): big groups go in slices
        most = max(1, _CPU_CALL_SCORES // (self.vocab_size + 1)) if logits.device.type == "cpu" else len(logits)
        for key, group in groups.items():
            if key == "failed":
                for entry in group:
                    logits[entry.row] = self.ended(logits[entry.row], self.rows[entry.key].stop_ids)
                continue
            step = len(group) if key in self._followed else most  # one call for a followed state
            for start in range(0, len(group), step):
                self._run_group(logits, group[start:start + step], ids)

    def ended(self, scores: torch.Tensor, stops: Sequence[int]) -> torch.Tensor:
        """`(..., vocab)` `scores` that allow only `stops` (a non-finite one becomes 0), so vLLM ends the request.

        Without stop ids nothing can end it (logged when it failed): the scores are returned as they are.
        """
        if not stops:
            return scores
        allowed = torch.zeros(self.vocab_size, dtype=torch.bool, device=scores.device)  # [V]
        allowed[list(stops)] = True
        finite = torch.where(scores.isfinite(), scores, torch.zeros_like(scores))
        return torch.where(allowed, finite, torch.full_like(scores, float("-inf")))

    def _run_group(self, logits: torch.Tensor, group: list[Entry], ids: GroupIds) -> None:
        try:
            self._process(logits, group, ids)
            return
        except Exception as error:
            key = self.rows[group[0].key].shared
            if len(group) == 1 or key in self._followed:
                reason = f"hfbridge's chain failed at this step: {error}"
                if key in self._followed:  # a shared state: the call may have updated some rows and not others
                    self._followed[key] = {}
                    reason += f" (a chain with a state, shared by {len(group)} requests: every one of them ends)"
                for entry in group:
                    self.fail(entry.key, reason)
                    logits[entry.row] = self.ended(logits[entry.row], self.rows[entry.key].stop_ids)
                return
        for entry in group:  # find the request(s) at fault; the others still get their scores
            self._run_group(logits, [entry], ids)

    def _process(self, logits: torch.Tensor, group: list[Entry], ids: GroupIds) -> None:
        first = self.rows[group[0].key]
        sampler = first.own if first.own is not None else self._samplers[first.shared][0]
        reads = reads_ids(sampler.processors)  # a chain that never reads the ids gets none (no histories, no padding)
        followed = self._followed.get(first.shared) if first.own is None else None
        # a followed chain reads only the last token of each row: no padding either
        padded = reads and first.own is None and not first.request.counts_from_prompt and followed is None
        # float32 copies of the rows, into a buffer kept between steps (processors may write into it):
        # a fresh (rows, vocab) tensor per group and step costs more than the processors on a CPU.
        # Rows are copied a run of consecutive rows at a time: an index tensor would cross to the device (a copy
        # that waits for it).
        scores = self._scratch(len(group), logits.device, padded)  # [G, V] or [G, V + 1]
        runs = _runs([entry.row for entry in group])
        vocab = self.vocab_size
        for position, row, length in runs:
            scores[position:position + length, :vocab].copy_(logits[row:row + length])
        if followed is not None:  # each row continues the same request's row of the last call, or starts fresh
            input_ids = ids(group, True)[:, -1:]  # [G, 1]: each row's last token (left padding), all the chain reads
            follow_rows(sampler.processors, [continued_row(followed.get(self.rows[entry.key].serial), entry.length)
                                             for entry in group], logits.device)
        else:
            input_ids = ids(group, padded) if reads else \
                torch.empty(len(group), 0, dtype=torch.long, device=logits.device)  # [G, T], or [G, 0]: never read
        with owned_scores():  # the rows are this call's copy: hfbridge's processors may write into them
            processed = sampler.process(input_ids, scores)  # [G, V(+1)]
        if followed is not None:
            self._followed[first.shared] = {self.rows[entry.key].serial: (position, entry.length)
                                            for position, entry in enumerate(group)}
        for position, row, length in runs:
            logits[row:row + length].copy_(processed[position:position + length, :vocab])

    def _scratch(self, rows: int, device: torch.device, padded: bool) -> torch.Tensor:
        """`(rows, vocab + padded)` float32 rows of a buffer kept between calls; the padding column at -inf."""
        width = self.vocab_size + 1
        buffer = self._buffer
        if buffer is None or buffer.shape[0] < rows or buffer.device != device:
            buffer = torch.empty(max(rows, 8), width, dtype=torch.float32, device=device)  # [R, V + 1]
            self._buffer = buffer
        if not padded:  # contiguous, as processors may expect: the buffer's first rows * V values
            return buffer.view(-1)[: rows * self.vocab_size].view(rows, self.vocab_size)
        view = buffer[:rows]
        view[:, self.vocab_size].fill_(float("-inf"))
        return view

    # -- a request's chain --------------------------------------------------------------------------

    def _attach(self, row: Row, params: Any) -> None:
        request = row.request
        check_token_ids_in_vocab(request.options, self.vocab_size)
        eos = None
        if request.needs_eos and "eos_token_id" not in request.options:
            eos = list(row.stop_ids) or None
        tokenizer = self._load_tokenizer() if request.string_breakers else None
        seed = getattr(params, "seed", None)
        prompt_length = row.prompt_length if request.counts_from_prompt else None
        key = (request.key, None if eos is None else tuple(eos), prompt_length)
        own = (request.random and seed is not None) or (request.stateful and request.counts_from_prompt)
        if not own and key not in self._samplers:
            shared = self._generator(self._key_seed(request.key)) if request.random else None
            sampler = build_sampler(request, prompt_length=prompt_length, eos_token_id=eos, tokenizer=tokenizer,
                                    generator=shared)
            stateful = bool(stateful_members(sampler.processors))
            # a chain per request for a state that only its rows' tokens can follow (a thinking budget), or beside
            # processors that read the histories (padded, a row could take another route than alone)
            own = stateful and not followed_by_caller(sampler.processors)
            if not own:
                self._samplers[key] = [sampler, 0]
                if stateful:
                    self._followed[key] = {}
        if own:
            generator = self._generator(seed if seed is not None else self._key_seed(request.key))
            row.own = build_sampler(request, prompt_length=row.prompt_length, eos_token_id=eos,
                                    tokenizer=tokenizer, generator=generator if request.random else None)
            return
        self._samplers[key][1] += 1
        row.shared = key

    def _release(self, row: Row | None) -> None:
        if row is None or row.shared is None:
            return
        entry = self._samplers[row.shared]
        entry[1] -= 1
        if entry[1] == 0:
            del self._samplers[row.shared]
            self._followed.pop(row.shared, None)
        row.shared = None

    def fail(self, index: int, reason: str) -> None:
        """End the request under `index` from now on (logged with `reason`)."""
        row = self.rows[index]
        self._release(row)
        row.own = None
        self._fail_row(row, reason)

    def _fail_row(self, row: Row, reason: str) -> None:
        row.failed = reason
        ending = "ends it at this step" if row.stop_ids else "cannot end it (it has no stop token ids)"
        logger.error("hfbridge: a request's options failed in the worker; hfbridge %s: %s", ending, reason)

    def _load_tokenizer(self) -> Any:
        if self._tokenizer is None:
            if self._tokenizer_loader is None:
                raise ValueError("`dry_sequence_breakers` holds strings, which need the model's tokenizer, and the "
                                 "engine has none; pass token-id sequences instead.")
            self._tokenizer = self._tokenizer_loader()
        return self._tokenizer

    def _key_seed(self, key: str) -> int:
        return (self.seed + zlib.crc32(key.encode())) % (2**63)

    def _generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)


def _runs(rows: Sequence[int]) -> list[tuple[int, int, int]]:
    """`(position, row, length)` for each run of consecutive `rows` (a group's rows in the batch, in order).

    >>> _runs([4, 5, 6, 1, 2, 9])
    [(0, 4, 3), (3, 1, 2), (5, 9, 1)]
    """
    runs: list[tuple[int, int, int]] = []
    for position, row in enumerate(rows):
        if runs and runs[-1][1] + runs[-1][2] == row:
            start, first, length = runs[-1]
            runs[-1] = (start, first, length + 1)
        else:
            runs.append((position, row, 1))
    return runs


def group_ids(histories: Sequence[torch.Tensor], padded: bool, pad_id: int) -> torch.Tensor:
    """`(rows, T)` long ids of a group's histories (each `(length,)`): left-padded with `pad_id` when `padded`.

    Without padding the histories are of one length (the group's key says so).
    """
    if not padded:
        return torch.stack(list(histories)).long()  # [G, T]
    # one width for all: left padding with id V, whose score column is -inf for the call (`Requests._scratch`)
    return torch.nn.utils.rnn.pad_sequence(list(histories), batch_first=True, padding_value=pad_id,
                                           padding_side="left").long()  # [G, T]


def register_with(interface: str, cls: type) -> None:
    """Make `cls` a virtual subclass of the `LogitsProcessor` of module `interface`, the other runner's, if present.

    vLLM's loader then lets the class through, and its `__init__`, called with the other runner's
    arguments, raises an error that names the right class (vLLM's own would not).
    """
    import importlib

    try:
        module = importlib.import_module(interface)
    except ImportError:  # a vLLM without that runner's interface: nothing to mistake
        return
    module.LogitsProcessor.register(cls)


def engine_settings(vllm_config: Any) -> dict[str, Any]:
    """What a worker's processor takes from vLLM's config: the seed, the tokenizer's loader, the model's eos ids."""
    model_config = vllm_config.model_config
    eos = getattr(model_config.hf_config, "eos_token_id", None)
    return {"seed": model_config.seed if model_config.seed is not None else 0,
            "tokenizer": lambda: _load_tokenizer(model_config),
            "default_eos": [] if eos is None else [eos] if isinstance(eos, int) else list(eos)}


def _load_tokenizer(model_config: Any) -> Any:
    """The model's tokenizer, as transformers loads it (DRY's string breakers map through it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_config.tokenizer, revision=model_config.tokenizer_revision,
                                         trust_remote_code=model_config.trust_remote_code)
