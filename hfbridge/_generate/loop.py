"""Step 5 of `generate`: the decoding loop of HF's `_sample`, with at most one host read per step.

Each step: call the model (its adapter) -> the last position's logits as `(rows, vocab)`, a view
of the model's output -> processors and token choice on one float32 copy (none for plain greedy)
-> finished rows get `pad_token_id` -> append -> stopping criteria. Nothing in a step reads a
device value on the host, except `torch.multinomial`'s own check in exact sampling and a
streamer's tokens: the validity of each row (NaN, nothing left to choose) and the finished rows
are flags on the device that `FinishedRows` reads together, once every `check_every` steps.

Reading the finished rows every fourth step changes no token (rows that finished meanwhile get
padding, as they would have):

>>> import torch
>>> from hfbridge import generate
>>> table = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
>>> prompts, options = torch.tensor([[1, 2], [3, 4]]), dict(max_new_tokens=6, eos_token_id=5, pad_token_id=0)
>>> torch.equal(generate(lambda ids: table[ids], prompts, check_every=4, **options),
...             generate(lambda ids: table[ids], prompts, **options))
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from hfbridge._generate.finished import FinishedRows, InvalidRows
from hfbridge._generate.prepared import Call as _Call
from hfbridge._generate.unembedded_ids import check_model_index_error
from hfbridge._hf.stand_in import special_token
from hfbridge._models.adapters import ModelAdapter
from hfbridge._models.callables import AdapterTypeError
from hfbridge._step.checks.step_errors import add_note, at_step
from hfbridge._step.run.cpu_shortcuts import cpu_shortcuts, greedy_choice
from hfbridge._step.run.route import Route
from hfbridge._step.run.sampler import Sampler, extract_logits


@dataclasses.dataclass(frozen=True)
class LoopOptions:
    """How the loop checks for finished rows.

    Attributes:
        check_every: Read the finished and validity flags every this many steps (1: every step,
            as HF). Rows that finish meanwhile get `pad_token_id` as they would anyway, and the
            steps decoded after the last row finished are cut off: the tokens are the same for
            every value; only up to `check_every - 1` extra model calls are made at the end. With
            logits processors, a `prefix_allowed_tokens_fn` or stopping criteria of your own, the
            flags are read at every step anyway: HF never calls them once every row has finished,
            and they may keep state (a grammar matcher that has accepted its end).
        synced: Keep this rank in lockstep with the other ranks of `torch.distributed`.
    """

    check_every: int = 1
    synced: bool = False


def check_every_option(value: Any) -> int:
    """`check_every` checked: an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`check_every` must be an int >= 1 (steps between checks for finished rows), "
                        f"got {type(value).__name__} {value!r}.")
    if value < 1:
        raise ValueError(f"`check_every` must be >= 1 (1 checks after every token, as HF), got {value}.")
    return value


def decode(adapter: ModelAdapter, call: _Call, streamer: Any, bar: Any, options: LoopOptions) -> None:
    """The loop of HF's `_sample`: one model call and one token per row per step, in place on `call`."""
    sampler, device = call.sampler, call.sequences.device
    rows_expected = call.sequences.shape[0]
    pad_token = special_token(call.config, "pad")
    pads_finished_rows = call.pads_finished
    route = sampler.route(keep_scores=call.scores is not None, keep_raw=call.raw_logits is not None)
    finished = FinishedRows(rows_expected, device, call.criteria, check_every=options.check_every,
                            synced=options.synced)
    # the step's logits are still at hand when its flags are read at the same step
    # user code (processors, criteria) must not run past the step where HF stops: read every step
    banned = call.banned  # banned strings and patterns (`banned_loop.py`), None without
    if banned is not None:
        if options.synced:
            raise ValueError("`banned_strings` / `banned_regex` roll rows back, which synced_gpus (ranks kept in "
                             "lockstep) does not support yet; pass synced_gpus=False, or drop the bans.")
        streamer = banned.streamer  # the tokens go to the caller's streamer once no rollback can take them back
    read_every_step = streamer is not None or call.user_code or banned is not None
    explain_now = options.check_every == 1 or options.synced or read_every_step
    masks = _GrowingMask(call.config.max_length)
    progress = _Progress(call)  # the note's context if the model raises, written only then
    vocab = None
    greedy_route: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] = greedy_choice
    step = 0
    while True:
        call.state["attention_mask"] = call.mask
        progress.step = step
        outputs, call.state = forward_and_update(adapter, call.sequences, call.state, step, progress)
        if finished.rank_done:
            # synced_gpus: this rank is finished but another is not. Its model was called (the
            # collectives inside need every rank); feed the last token again next time, as HF does.
            del outputs
            call.sequences = torch.cat([call.sequences, call.sequences[:, -1:]], dim=-1)
            call.mask = masks.longer(call.mask)
            if finished.read():
                break
            continue
        view = _rows(sampler, adapter.logits(outputs), step, rows_expected, call.prompts, call.expand)  # [N, V]
        if view.device != device:
            view = view.to(device)  # HF moves the logits to the device of input_ids
        if vocab is None:
            vocab = view.shape[1]
            at_step(step, lambda: sampler.input_rows(call.sequences, view))  # prompt ids within the vocabulary
            if call.unconditional is not None:  # and the negative prompt's, before guidance feeds it
                at_step(step, lambda: call.unconditional.check_vocab(vocab, sampler.vocab_size))
            if not cpu_shortcuts(view):  # the route, decided once: the device and the context stay
                greedy_route = _torch_greedy
        elif view.shape[1] != vocab:
            raise ValueError(
                f"generate(): at step {step} the model returned logits with {view.shape[1]} vocabulary columns, "
                f"but {vocab} at step 0; the vocabulary size must stay the same."
            )
        if banned is not None:
            view, saved = banned.before_choose(call.sequences, view)  # the tokens tried here before: -inf
        tokens = _choose(sampler, call, view, step, route, greedy_route, finished, explain_now)  # [N]
        if banned is not None:
            tokens = banned.after_choose(call.sequences, tokens, saved)  # rows replaying keep their own tokens
        del outputs, view
        if pads_finished_rows:
            # finished sentences get the padding token, as HF's `_sample` (`where` gives the same ids)
            assert pad_token is not None  # `_prepare` refuses an eos criterion without a pad token
            tokens = torch.where(finished.unfinished, tokens, pad_token)
        call.sequences = torch.cat([call.sequences, tokens[:, None]], dim=-1)  # [N, T + 1]
        call.mask = masks.longer(call.mask)
        if streamer is not None:
            streamer.put(tokens.cpu())
        if bar is not None:
            bar.update(1)
        try:
            # a streamer has waited for the tokens anyway: check every step so that it never sees more
            stop = finished.after_step(call.sequences, call.scores, step=step, force_read=read_every_step)
        except InvalidRows as bad:
            named = None if banned is None else banned.named(  # a ban forbade what the processors kept
                bad.step, bad.row, call.sequences.shape[1] - 1, [type(p).__name__ for p in sampler.processors])
            raise (named or _invalid_error(bad, sampler, rows_expected)) from None
        if banned is not None:
            stop = banned.after_step(call, adapter, finished, stop, bar)  # may roll the batch back
        step += 1
        if stop:
            break
    _cut(call, finished.finish_length)
    if banned is not None:
        banned.flush(call.sequences)


def _cut(call: _Call, length: int | None) -> None:
    """Drop the steps decoded after every row had finished (`check_every`, `synced_gpus`)."""
    extra = call.sequences.shape[1] - length if length is not None else 0
    if extra <= 0:
        return
    call.sequences = call.sequences[:, :length].contiguous()
    call.mask = call.mask[:, :length]
    if call.scores is not None:
        call.scores = call.scores[: len(call.scores) - extra]
    if call.raw_logits is not None:
        call.raw_logits = call.raw_logits[: len(call.raw_logits) - extra]


class _Progress:
    """The note's `context` for a failing model call, written only if it fails (the loop sets `step`)."""

    __slots__ = ("call", "step")

    def __init__(self, call: _Call):
        self.call, self.step = call, 0

    def __str__(self) -> str:
        return f"{self.call.sequences.shape[1]} tokens so far, {self.step} generated"


class _GrowingMask:
    """The attention mask one column longer each step, as views of a buffer of ones (no copy a step).

    The buffer holds the prompt's mask and room for `max_length` (at most 256 columns past the
    prompt at first); when full it doubles. Its columns after the prompt are never written, so a
    view handed to the model stays what it was.
    """

    __slots__ = ("buffer", "max_length")

    def __init__(self, max_length: int | None):
        self.max_length = max_length
        self.buffer: torch.Tensor | None = None  # [N, T + room]

    def longer(self, mask: torch.Tensor) -> torch.Tensor:
        """`mask` (the last view, or any `(N, T)` mask) with one more column of ones."""
        length = mask.shape[1] + 1
        buffer = self.buffer
        if buffer is None or length > buffer.shape[1] or mask.data_ptr() != buffer.data_ptr():
            room = max(mask.shape[1], 256) if buffer is not None or self.max_length is None else \
                min(256, max(self.max_length - mask.shape[1], 1))
            buffer = self.buffer = torch.cat([mask, mask.new_ones((mask.shape[0], room))], dim=-1)
        return buffer[:, :length]


def _torch_greedy(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`greedy_choice` on the accelerator route: `(ids, best)` from one `max` over the vocabulary."""
    best, ids = rows.max(dim=-1)
    return ids, best


def forward_and_update(adapter: ModelAdapter, input_ids: torch.Tensor, state: dict[str, Any], step: int,
                       context: object, check: Callable[[dict[str, Any]], None] | None = None
                       ) -> tuple[Any, dict[str, Any]]:
    """One model call through `adapter` and its state update, for every loop (hfbridge's and HF's on a host).

    An `AdapterTypeError` becomes a `TypeError` naming the step; anything else the model, the adapter
    or `check` (run on the new state) raises propagates with a note naming the step and `context`
    (a string, or an object whose `str` is written only then).
    """
    try:
        outputs = adapter.forward(input_ids, state)
        state = adapter.update(outputs, input_ids, state)
        if check is not None:
            check(state)
    except AdapterTypeError as error:
        raise TypeError(f"generate(): at step {step}: {error}") from None
    except Exception as error:
        check_model_index_error(error, input_ids, step)  # a drawn id past the embedding: vocab_size=
        add_note(error, f"hfbridge.generate: raised at step {step} (step 0 is the prompt's forward pass; {context}).")
        raise
    return outputs, state


def _choose(sampler: Sampler, call: _Call, view: torch.Tensor, step: int, route: Route,
            greedy: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], finished: FinishedRows,
            explain_now: bool) -> torch.Tensor:
    """The sampler's one step on `view`, the model's last-position logits `(rows, vocab)` (read, never
    written), without a host read; the outputs the call keeps recorded, each row's validity noted in
    `finished`, which checks it at its next read."""
    scores = None
    if call.raw_logits is not None:
        scores = _float_copy(view)  # HF keeps the very tensor its processors receive
        call.raw_logits += (scores,)
        if route is Route.FAST:
            scores = None  # the fused path makes the copies it needs
    result = sampler.step(call.sequences, view, scores=scores, route=route, greedy=greedy, at=step)
    if call.scores is not None:
        if result.scores is None:  # the fast path in a phase of `thinking_options`
            raise ValueError("generate(): `output_scores=True` with `fast=True` and `thinking_options`: the fast path "
                             "keeps no processed scores; pass fast=False.")
        call.scores += (result.scores,)
    if result.invalid is not None:
        finished.note_invalid(step, result.invalid, result.explain if explain_now else None)
    return result.tokens


def _float_copy(rows: torch.Tensor) -> torch.Tensor:
    return rows.to(dtype=torch.float32, copy=True)


def _invalid_error(bad: InvalidRows, sampler: Sampler, rows: int) -> ValueError:
    """The error for a row with nothing to choose, naming the step and the row."""
    if bad.explain is not None:
        try:
            bad.explain()
        except ValueError as error:
            return ValueError(f"generate(): at step {bad.step}: {error}")
    what = "NaN" if bad.nan else "-inf for every token"
    names = [type(p).__name__ for p in sampler.processors]
    return ValueError(
        f"generate(): at step {bad.step}: row {bad.row} has nothing left to choose ({bad.rows} of {rows} rows): "
        f"its scores after the logits processors {names} are {what}. Check the model's forward pass for NaN "
        "(overflow in fp16?), or relax options that remove tokens (`bad_words_ids`, `suppress_tokens`, `min_p`)."
    )


def _rows(sampler: Sampler, output: Any, step: int, expected: int, batch: int, expand: int) -> torch.Tensor:
    """The last position's logits `(rows, vocab)`, a view of the model's output, with the row count checked."""
    try:
        logits = extract_logits(output)
        rows = sampler.last_rows(logits)
    except (ValueError, TypeError) as error:  # as `at_step`, without a closure per step
        kind = ValueError if isinstance(error, ValueError) else TypeError
        raise kind(f"generate(): at step {step}: {error}") from None
    if rows.shape[0] != expected:
        layout = sampler.layout_of(logits).pattern
        raise ValueError(
            f"generate(): at step {step} the model returned logits of shape {tuple(logits.shape)} (layout "
            f"{layout!r}), which give {rows.shape[0]} rows, expected {expected}: one per sequence "
            f"({batch} prompts x num_return_sequences={expand})."
        )
    return rows
