"""vLLM's persistent batch as hfbridge sees it: which row holds which request, and one step's processing.

vLLM keeps its running requests in rows `0..batch_size-1` and tells a logits processor which rows
were removed, added and moved before each step. `Batch` keeps one `Row` per request with hfbridge
options (its checked options, its token `History`, its stop ids) and runs, at each step, one
`Sampler.process` call per group of rows that share a chain:

- rows with equal options share one `Sampler`; their histories are left-padded to one width with an
  id one past the vocabulary, whose score column (added for the call, then dropped) is `-inf`, so
  the padding is a token that never matches and is never chosen (every processor then sees each row
  as it would alone; `tests/vllm/test_batch.py` checks this per option);
- rows whose options count from the end of the prompt (`min_new_tokens`, presence/frequency
  penalties without `penalty_last_n`, ...) share a call with rows of the same prompt length and
  length so far, without padding, through a `Sampler` built for that prompt length;
- a request whose options keep a state across steps (mirostat), or draw with the request's own
  `seed` (XTC), has a `Sampler` of its own, which follows that one request wherever vLLM moves it.

Rows without hfbridge options are never touched. A request whose options fail in the worker (a token
id outside the vocabulary, no tokenizer for DRY's string breakers, an error inside the chain) is
logged and ended (its row allows only its stop tokens), so that the engine keeps serving the others.

>>> import torch
>>> from types import SimpleNamespace
>>> params = SimpleNamespace(extra_args={"hfbridge": {"suppress_tokens": [1]}}, temperature=0.0,
...                          all_stop_token_ids={2}, seed=None)
>>> batch = Batch(vocab_size=4)
>>> batch.update(added=[(0, params, [3, 3], [])])
>>> batch.apply(torch.zeros(2, 4)).tolist()
[[0.0, -inf, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import torch

from hfbridge._step.option_checks import check_token_ids_in_vocab
from hfbridge._step.sampler import Sampler
from hfbridge.vllm._history import History
from hfbridge.vllm._options import RequestOptions, build_sampler, check_request

logger = logging.getLogger(__name__)

_CPU_CALL_SCORES = 1 << 17  # the most scores one chain call takes on a CPU (see `Batch.apply`)
Added = tuple[int, Any, "Sequence[int] | None", Sequence[int]]  # (row, SamplingParams, prompt ids, output ids)
Moved = tuple[int, int, bool]  # (from, to, swap)


@dataclasses.dataclass
class Row:
    """One request with hfbridge options, in the row vLLM gave it."""

    request: RequestOptions
    history: History
    stop_ids: tuple[int, ...]
    shared: Hashable | None = None  # its key in `Batch._samplers`, when it shares a Sampler
    own: Sampler | None = None  # its own Sampler (stateful or seeded)
    failed: str | None = None  # why the request is being ended


class Batch:
    """The rows of vLLM's persistent batch that carry hfbridge options; see the module.

    Args:
        vocab_size: The width of vLLM's logits (the model's vocabulary).
        device: Where the logits are (the histories live there too).
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
        self._rows: dict[int, Row] = {}
        self._samplers: dict[Hashable, list[Any]] = {}  # key -> [Sampler, rows using it]
        self._buffer: torch.Tensor | None = None  # [R, V + 1] float32 scores, reused by every call

    def __len__(self) -> int:
        return len(self._rows)

    def update(self, removed: Iterable[int] = (), added: Iterable[Added] = (), moved: Iterable[Moved] = ()) -> None:
        """Apply vLLM's batch changes, in vLLM's order: removed, added, moved."""
        for index in removed:
            self._release(self._rows.pop(index, None))
        for index, params, prompt, output in added:
            self._release(self._rows.pop(index, None))
            row = self._new_row(params, prompt, output)
            if row is not None:
                self._rows[index] = row
        for source, target, swap in moved:
            first, second = self._rows.pop(source, None), self._rows.pop(target, None)
            if first is not None:
                self._rows[target] = first
            if swap and second is not None:
                self._rows[source] = second
            elif not swap:
                self._release(second)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Process the rows with hfbridge options of `(rows, vocab)` `logits`, in place; returns `logits`."""
        if not self._rows:
            return logits
        groups: dict[Hashable, list[int]] = {}
        for index in sorted(self._rows):
            row = self._rows[index]
            if row.failed is None:
                row.history.sync()
                if row.own is not None:
                    key: Hashable = ("own", index)
                elif row.request.counts_from_prompt:
                    key = (row.shared, row.history.length)
                else:
                    key = row.shared
            else:
                key = "failed"
            groups.setdefault(key, []).append(index)
        # on a CPU, calls over more than ~2^17 scores run slower per row than smaller ones (measured with
        # benchmarks/vllm.py: the processors' temporaries outgrow the caches): big groups go in slices
        most = max(1, _CPU_CALL_SCORES // (self.vocab_size + 1)) if logits.device.type == "cpu" else len(self._rows)
        for key, indices in groups.items():
            if key == "failed":
                self._end(logits, indices)
                continue
            for start in range(0, len(indices), most):
                self._run_group(logits, indices[start:start + most])
        return logits

    # -- one step ---------------------------------------------------------------------------------

    def _run_group(self, logits: torch.Tensor, indices: list[int]) -> None:
        try:
            self._process(logits, indices)
            return
        except Exception as error:
            if len(indices) == 1:
                self._fail(indices[0], f"hfbridge's chain failed at this step: {error}")
                self._end(logits, indices)
                return
        for index in indices:  # find the request(s) at fault; the others still get their scores
            self._run_group(logits, [index])

    def _process(self, logits: torch.Tensor, indices: list[int]) -> None:
        rows = [self._rows[index] for index in indices]
        first = rows[0]
        sampler = first.own if first.own is not None else self._samplers[first.shared][0]
        histories = [row.history.tokens() for row in rows]
        padded = first.own is None and not first.request.counts_from_prompt
        # float32 copies of the rows, into a buffer kept between steps (processors may write into it):
        # a fresh (rows, vocab) tensor per group and step costs more than the processors on a CPU
        scores = self._scratch(len(rows), logits.device, padded)  # [G, V] or [G, V + 1]
        for row, index in enumerate(indices):
            scores[row, : self.vocab_size].copy_(logits[index])
        if padded:
            # one width for all: left padding with id V, whose column is -inf (set by `_scratch`), dropped after
            ids = torch.nn.utils.rnn.pad_sequence(histories, batch_first=True, padding_value=self.vocab_size,
                                                  padding_side="left")  # [G, T]
        else:
            ids = torch.stack(histories)  # [G, T] equal lengths by construction
        processed = sampler.process(ids, scores)  # [G, V(+1)]
        for row, index in enumerate(indices):
            logits[index].copy_(processed[row, : self.vocab_size])

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

    def _end(self, logits: torch.Tensor, indices: list[int]) -> None:
        """Rows of failed requests allow only their stop tokens, so vLLM ends them at this step."""
        for index in indices:
            stops = self._rows[index].stop_ids
            if not stops:
                continue  # nothing ends it: logged when it failed; left as the model gave it
            row = logits[index]
            keep = row[list(stops)].clone()
            row.fill_(float("-inf"))
            row[list(stops)] = torch.where(keep.isfinite(), keep, torch.zeros_like(keep))

    # -- requests ---------------------------------------------------------------------------------

    def _new_row(self, params: Any, prompt: Sequence[int] | None, output: Sequence[int]) -> Row | None:
        failure: str | None = None
        try:
            request = check_request(params)
        except (TypeError, ValueError) as error:  # vLLM's front end checks this first; a direct call may not
            request, failure = None, str(error)
        if request is None and failure is None:
            return None
        stops = tuple(sorted(getattr(params, "all_stop_token_ids", None) or ())) or self._default_eos
        stops = tuple(token for token in stops if 0 <= token < self.vocab_size)
        if request is None or prompt is None:
            placeholder = RequestOptions({}, False, "", False, False, False, False, False)
            row = Row(placeholder, History([], output, self.device), stops)
            self._fail_row(row, failure or "hfbridge options need the prompt's token ids (prompt embeddings "
                                            "carry none)")
            return row
        row = Row(request, History(prompt, output, self.device), stops)
        try:
            self._attach(row, params)
        except Exception as error:
            self._fail_row(row, str(error))
        return row

    def _attach(self, row: Row, params: Any) -> None:
        request = row.request
        check_token_ids_in_vocab(request.options, self.vocab_size)
        eos = None
        if request.needs_eos and "eos_token_id" not in request.options:
            eos = list(row.stop_ids) or None
        tokenizer = self._load_tokenizer() if request.string_breakers else None
        seed = getattr(params, "seed", None)
        if request.stateful or (request.random and seed is not None):
            generator = self._generator(seed if seed is not None else self._key_seed(request.key))
            row.own = build_sampler(request, prompt_length=row.history.prompt_length, eos_token_id=eos,
                                    tokenizer=tokenizer, generator=generator if request.random else None)
            return
        prompt_length = row.history.prompt_length if request.counts_from_prompt else None
        key = (request.key, None if eos is None else tuple(eos), prompt_length)
        if key not in self._samplers:
            shared = self._generator(self._key_seed(request.key)) if request.random else None
            sampler = build_sampler(request, prompt_length=prompt_length, eos_token_id=eos, tokenizer=tokenizer,
                                    generator=shared)
            self._samplers[key] = [sampler, 0]
        self._samplers[key][1] += 1
        row.shared = key

    def _release(self, row: Row | None) -> None:
        if row is None or row.shared is None:
            return
        entry = self._samplers[row.shared]
        entry[1] -= 1
        if entry[1] == 0:
            del self._samplers[row.shared]
        row.shared = None

    def _fail(self, index: int, reason: str) -> None:
        row = self._rows[index]
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
