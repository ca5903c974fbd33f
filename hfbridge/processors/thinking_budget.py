"""A thinking budget: after `budget` tokens inside a thinking span, force an optional message and the end tag.

llama.cpp's reasoning-budget sampler (`common/reasoning-budget.cpp`), one state machine per row, fed
each chosen token:

1. **idle** (or **done**): a start tag (`start_ids`, e.g. `<think>`) completes -> **counting** with
   the full budget (a budget of 0 goes straight to forcing). Done re-arms on a new start tag.
2. **counting**: the end tag completes -> **done** (a natural end; those tokens are not counted);
   otherwise one token of the budget is spent, and at 0 -> **forcing**, or **waiting** when the token
   ends inside a UTF-8 character (its text ends with an incomplete byte sequence);
3. **waiting**: the end tag completes -> done; a token that completes its character -> forcing;
4. **forcing**: every score but the next forced token's (`message_ids` then `end_ids`) is set to
   -inf; when the last one is chosen -> **done**.

Tags are matched as llama.cpp matches them: a token that breaks a partial match restarts it (at 1
if it is the tag's first token). The UTF-8 test needs `tokenizer=` (a token is incomplete when its
decoded text ends with U+FFFD, which is what an incomplete byte sequence decodes to); without a
tokenizer every token counts as complete, as llama.cpp without a vocabulary.

The prompt is not counted. A row starts (at its first call, or any call that continues no earlier
one) by reading its tokens as a prompt: when its last start tag comes after its last end tag (a
chat template that opens the thinking block), it starts counting with the generated tokens, as
llama.cpp's server arms the sampler then; otherwise it is idle. With `prompt_length`, a first call
whose `input_ids` hold generated tokens (a `sample_step` in a hand-written loop) replays them.

One state per row, following rows by their tokens (`_row_history.py`): it works in hfbridge's loops,
which call `reset` / `reorder` / `rollback`, and in transformers' own `generate` (sampling, beams,
assisted decoding), which calls none of them. Sync-free on an accelerator; on CPU, while no row is
forced, the scores come back as they came. Greedy or sampling alike: it is not a warper.

>>> import torch
>>> budget = ThinkingBudgetLogitsProcessor(2, start_ids=[7], end_ids=[8, 9])
>>> ids = torch.tensor([[1, 7]])                                  # the prompt opens the span
>>> for token in (3, 4):                                          # two thinking tokens
...     _ = budget(ids, torch.zeros(1, 10)); ids = torch.cat([ids, torch.tensor([[token]])], 1)
>>> budget(ids, torch.zeros(1, 10)).isfinite().nonzero()[:, 1].tolist()   # the end tag is forced
[8]
"""

from __future__ import annotations

import numbers
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LogitsProcessor

from hfbridge.processors._cpu_side import host_path
from hfbridge.processors._row_history import RowHistory
from hfbridge.processors._rows import RowParam, described, token_label

__all__ = ["BudgetState", "ThinkingBudgetLogitsProcessor", "span_open", "tag_ids"]

IDLE, COUNTING, WAITING, FORCING, DONE = range(5)  # the phases; a state row is (phase, remaining, start, end, forced)
_PHASES = ("idle", "counting", "waiting", "forcing", "done")


@dataclass(frozen=True)
class BudgetState:
    """A row's thinking budget after a call (`ThinkingBudgetLogitsProcessor.describe_last`).

    Attributes:
        phase: ``"idle"`` (outside a span), ``"counting"``, ``"waiting"`` (spent, inside a UTF-8
            character), ``"forcing"`` or ``"done"`` (the span ended).
        budget: The row's budget.
        remaining: Thinking tokens left (while counting).
        forced: The token forced at this call (forcing), else None.
        position: Which forced token it is (0-based over the message, then the end tag).
        message: Tokens of the message.
        end: Tokens of the end tag.
    """

    phase: str
    budget: int
    remaining: int
    forced: int | None
    position: int
    message: int
    end: int

    @property
    def tokens(self) -> list[int]:
        return [] if self.forced is None else [self.forced]

    def text(self, label: Callable[[int], str] = token_label) -> str:
        """One line: ``budget of 2 spent: forces '</think>' (end tag, token 1 of 1)``."""
        if self.phase == "forcing" and self.forced is not None:
            part, at, of = (("message", self.position, self.message) if self.position < self.message
                            else ("end tag", self.position - self.message, self.end))
            return f"budget of {self.budget} spent: forces {label(self.forced)} ({part}, token {at + 1} of {of})"
        return {"idle": "outside a thinking span", "done": "the thinking span has ended",
                "waiting": f"budget of {self.budget} spent: waits for a whole UTF-8 character",
                "counting": f"thinking: {self.remaining} of {self.budget} tokens left"}[self.phase]


class ThinkingBudgetLogitsProcessor(LogitsProcessor):
    """Force the end of a thinking span after `budget` tokens (see the module).

    Args:
        budget: Thinking tokens allowed per span (int >= 0). One value, or one per row.
        start_ids: The start tag: token ids, or a string (needs `tokenizer`). E.g. "<think>". A string
            that is one entry of the tokenizer's vocabulary is that token, as `convert_tokens_to_ids` finds
            it; another is encoded; one that encodes to the unknown token is refused.
        end_ids: The end tag, likewise. E.g. "</think>".
        message_ids: Forced before the end tag when the budget runs out (ids or a string). Default: none.
        tokenizer: A transformers tokenizer: tokenizes string tags and tells tokens that end inside a
            UTF-8 character. Default: none (tags as ids, every token complete).
        prompt_length: The prompt's length in tokens, to replay generated tokens at a first call.
            Default: none (a first call's tokens are all prompt).

    Attributes:
        phase: `(rows,)` each row's phase after the last call (0 idle, 1 counting, 2 waiting for
            UTF-8, 3 forcing, 4 done); None before the first call.
    """

    def __init__(self, budget: Any, start_ids: Any, end_ids: Any, message_ids: Any = None, tokenizer: Any = None,
                 prompt_length: int | None = None):
        self.budget = RowParam("budget", budget, integer=True, minimum=0)
        self.start_ids = _ids("start_ids", start_ids, tokenizer)
        self.end_ids = _ids("end_ids", end_ids, tokenizer)
        self.message_ids = [] if message_ids is None else _ids("message_ids", message_ids, tokenizer, empty=True)
        if prompt_length is not None and (isinstance(prompt_length, bool) or not isinstance(prompt_length, int)
                                          or prompt_length < 0):
            raise ValueError(f"`prompt_length` must be an int >= 0, got {described(prompt_length)}.")
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        self._forced = self.message_ids + self.end_ids
        self._tensors: dict[tuple[int, torch.device], tuple[torch.Tensor, ...]] = {}
        self.reset()

    def reset(self) -> None:
        """Forget every row."""
        self._history = RowHistory(self.budget)
        self.phase: torch.Tensor | None = None
        self._state: torch.Tensor | None = None

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Row `i` now continues row `beam_idx[i]`."""
        self._history.reorder(beam_idx)

    def rollback(self, lengths: torch.Tensor) -> None:
        """Row `i` now has `lengths[i]` tokens; its state is what it was then."""
        self._history.rollback(lengths)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids is None:
            raise ValueError("ThinkingBudgetLogitsProcessor reads the tokens chosen so far: pass `input_ids`.")
        rows, vocab = scores.shape  # [B, V]
        top = max(self.start_ids + self.end_ids + self._forced)
        if top >= vocab:
            raise ValueError(f"the thinking tags and message hold token id {top}, outside the scores' vocabulary "
                             f"of {vocab} tokens.")
        device = input_ids.device
        start, end, forced, complete = self._on(vocab, device)
        budget = self.budget.tensor(rows, device, torch.long)  # [B]
        history = self._history
        usable = history.length is not None and history.length + 1 >= input_ids.shape[1]
        found = history.lookup(input_ids, width=5, dtype=torch.long)
        if usable:
            fresh = self._arm(input_ids, budget, start, end)  # unmatched rows: their tokens are a prompt
        else:  # a first call: the prompt, then the generated tokens if `prompt_length` says where they start
            cut = input_ids.shape[1] if self.prompt_length is None else min(self.prompt_length, input_ids.shape[1])
            fresh = self._arm(input_ids[:, :cut], budget, start, end)
            for position in range(cut, input_ids.shape[1]):
                fresh = _advance(fresh, input_ids[:, position], budget, start, end, len(self._forced), complete)
        state = torch.where(found.repeat[:, None], found.at, fresh)
        if input_ids.shape[1]:  # no tokens (a step without context): nothing to continue
            advanced = _advance(found.before, input_ids[:, -1], budget, start, end, len(self._forced), complete)
            state = torch.where(found.previous[:, None], advanced, state)
        history.record(input_ids, found, state)
        phase, forced_at = state[:, 0], state[:, 4]
        self.phase = phase
        self._state = state  # what `describe_last` reads: a reference, no work
        if host_path(phase) and not bool((phase == FORCING).any()):  # a host read: free on CPU
            return scores  # nothing forced: the scores as they came, as HF's processors return them
        token = forced[forced_at.clamp(max=len(self._forced) - 1)][:, None]  # [B, 1] the token to force now
        # forcing rows: every score -inf, then the forced token's own score back (other rows: their own back)
        out = scores.masked_fill((phase == FORCING)[:, None], -torch.inf)
        return out.scatter_(1, token, scores.gather(1, token))

    def _arm(self, ids: torch.Tensor, budget: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """`(rows, 5)` the state of rows whose `ids` are a prompt: counting if its last start tag is open."""
        inside = span_open(ids, start, end)  # [B]
        phase = torch.where(inside, torch.where(budget <= 0, FORCING, COUNTING), IDLE)
        zeros = torch.zeros_like(budget)
        return torch.stack([phase, budget, zeros, zeros, zeros], dim=-1)

    def _on(self, vocab: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        key = (vocab, device)
        cached = self._tensors.get(key)
        if cached is None:
            def tensor(values: list[int]) -> torch.Tensor:
                return torch.tensor(values, dtype=torch.long, device=device)

            complete = torch.ones(vocab, dtype=torch.bool)
            if self.tokenizer is not None:
                incomplete = _incomplete_tokens(self.tokenizer)
                incomplete = [token for token in incomplete if token < vocab]
                complete[incomplete] = False
            cached = (tensor(self.start_ids), tensor(self.end_ids), tensor(self._forced), complete.to(device))
            self._tensors[key] = cached
        return cached

    # a trait for views: `describe_last` after a call on any sequence's ids says what the step there did
    replays_from_ids = True

    def describe_last(self, input_ids: torch.Tensor | None = None) -> list[BudgetState | None]:
        """Each row's state after the last call (`BudgetState`): counting, forcing (which token), ...

        Read from the state the call kept (no work in a step). None per row before any call, or when
        ``input_ids`` `(rows, seq)` has another number of rows than the last call.
        """
        if self._state is None or (input_ids is not None and input_ids.shape[0] != self._state.shape[0]):
            return [None] * (1 if input_ids is None else input_ids.shape[0])
        budgets = self.budget.for_rows(self._state.shape[0])
        found: list[BudgetState | None] = []
        for row, (phase, remaining, _, _, forced_at) in enumerate(self._state.tolist()):
            token = self._forced[min(forced_at, len(self._forced) - 1)] if phase == FORCING else None
            found.append(BudgetState(_PHASES[phase], int(budgets[row]), remaining, token, forced_at,
                                     len(self.message_ids), len(self.end_ids)))
        return found

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(budget={self.budget}, start_ids={self.start_ids}, end_ids={self.end_ids}, "
                f"message_ids={self.message_ids})")


def _advance(state: torch.Tensor, token: torch.Tensor, budget: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
             forced: int, complete: torch.Tensor) -> torch.Tensor:
    """`(rows, 5)` each row's state after `token` `(rows,)` (llama.cpp's `common_reasoning_budget_accept`)."""
    phase, remaining, start_at, end_at, force_at = state.unbind(-1)
    token = token.long()
    start_next, started = _match(start, start_at, token)
    end_next, ended = _match(end, end_at, token)
    whole = complete[token.clamp(0, complete.shape[0] - 1)]  # [B] the token ends on a whole character
    # idle or done: the start tag arms the budget
    waiting_start = (phase == IDLE) | (phase == DONE)
    armed = waiting_start & started
    start_at = torch.where(waiting_start, start_next, start_at)
    new_phase = torch.where(armed, torch.where(budget <= 0, FORCING, COUNTING), phase)
    remaining = torch.where(armed, budget, remaining)
    end_at = torch.where(armed, 0, end_at)
    force_at = torch.where(armed, 0, force_at)
    # counting or waiting: the end tag ends it; otherwise count, and force once spent and whole
    counting, waiting = phase == COUNTING, phase == WAITING
    thinking = counting | waiting
    end_at = torch.where(thinking, end_next, end_at)
    new_phase = torch.where(thinking & ended, DONE, new_phase)
    going = thinking & ~ended
    remaining = torch.where(counting & going, remaining - 1, remaining)
    spent = counting & going & (remaining <= 0)
    force = (waiting & going & whole) | (spent & whole)
    wait = spent & ~whole
    new_phase = torch.where(force, FORCING, torch.where(wait, WAITING, new_phase))
    force_at = torch.where(force, 0, force_at)
    end_at = torch.where(force | wait, 0, end_at)
    # forcing: one forced token chosen
    forcing = phase == FORCING
    force_at = torch.where(forcing, force_at + 1, force_at)
    new_phase = torch.where(forcing & (force_at >= forced), DONE, new_phase)
    return torch.stack([new_phase, remaining, start_at, end_at, force_at], dim=-1)


def _match(tag: torch.Tensor, at: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's `token_matcher.advance`: `(next position, the tag completed)` per row."""
    hit = token == tag[at.clamp(max=tag.shape[0] - 1)]
    following = at + 1
    done = hit & (following >= tag.shape[0])
    restart = (token == tag[0]).long()
    return torch.where(hit, torch.where(done, 0, following), restart), done


def _last_end(ids: torch.Tensor, tag: torch.Tensor) -> torch.Tensor:
    """`(rows,)` where the last occurrence of `tag` in each row ends (tokens up to it), 0 if none."""
    rows, length = ids.shape
    size = tag.shape[0]
    if length < size:
        return torch.zeros(rows, dtype=torch.long, device=ids.device)
    hits = (ids.unfold(1, size, 1) == tag).all(-1)  # [B, L - size + 1]
    ends = torch.arange(size, length + 1, device=ids.device)
    return torch.where(hits, ends, 0).amax(-1)


def span_open(ids: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """`(rows,)` bool: each row of `ids` `(rows, seq)` is inside a thinking span, its last start tag
    (`start`, `(k,)` ids) not closed by an end tag (`end`) after it; on the device, no host read.

    >>> span_open(torch.tensor([[1, 7, 3], [7, 8, 9]]), torch.tensor([7]), torch.tensor([8, 9])).tolist()
    [True, False]
    """
    return _last_end(ids, start) > _last_end(ids, end)


def tag_ids(name: str, value: Any, tokenizer: Any) -> list[int]:
    """A thinking tag's token ids: a list / 1-D tensor of ids, or a string tokenized by `tokenizer` as the
    budget finds its tags (a vocabulary entry as `convert_tokens_to_ids` finds it, else `encode`); errors
    name the option `name`.

    >>> tag_ids("thinking_start", [7], None)
    [7]
    """
    return _ids(name, value, tokenizer)


def _ids(name: str, value: Any, tokenizer: Any, *, empty: bool = False) -> list[int]:
    """Token ids from a list / 1-D tensor of ints, or a string tokenized by `tokenizer`."""
    if isinstance(value, str):
        if tokenizer is None:
            raise ValueError(f"`{name}` is a string ({value!r}): pass `tokenizer=` to tokenize it, or give the "
                             "token ids.")
        if not value:
            if empty:
                return []
            raise ValueError(f"`{name}` is an empty string.")
        return _tokenized(name, value, tokenizer, tag=not empty)
    if hasattr(value, "tolist") and getattr(value, "ndim", None) == 1 and str(value.dtype).split(".")[-1].startswith(
            ("int", "uint")):
        value = value.tolist()  # a tensor or numpy array of ids, read once at construction
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(token, numbers.Integral) and not isinstance(token, bool) and int(token) >= 0 for token in value):
        raise TypeError(f"`{name}` must be a string or a sequence of token ids (ints >= 0), got {described(value)}.")
    if not value and not empty:
        raise ValueError(f"`{name}` is empty: give at least one token id.")
    return [int(token) for token in value]


def _tokenized(name: str, value: str, tokenizer: Any, *, tag: bool) -> list[int]:
    """A string's token ids, found as transformers finds a special token: a tag that is one entry of the
    vocabulary (an added token, or a plain entry that `encode` would split) is that entry
    (`convert_tokens_to_ids`); anything else is `encode`d. A string that encodes to the unknown token is
    refused: such a tag could never be matched."""
    unknown = getattr(tokenizer, "unk_token_id", None)
    try:
        if tag and hasattr(tokenizer, "convert_tokens_to_ids"):
            single = tokenizer.convert_tokens_to_ids(value)
            if isinstance(single, numbers.Integral) and not isinstance(single, bool) and int(single) >= 0 and (
                    single != unknown or value == getattr(tokenizer, "unk_token", None)):
                return [int(single)]
        ids = [int(token) for token in tokenizer.encode(value, add_special_tokens=False)]
    except Exception as error:  # anything a tokenizer-like object raises
        raise TypeError(f"`tokenizer` must be a transformers tokenizer (encode), got "
                        f"{type(tokenizer).__name__}: {error}") from None
    if not ids:
        raise ValueError(f"`{name}` {value!r} tokenizes to no tokens.")
    if isinstance(unknown, numbers.Integral) and unknown in ids:
        raise ValueError(f"`{name}` {value!r} is not a token of the tokenizer and encodes to unknown tokens "
                         f"({ids}, unk_token_id={unknown}), so it could never be matched; pass a string the "
                         "tokenizer knows, or the tag's token ids.")
    return ids


# Decoding every token of a large vocabulary takes about a second: the answer is kept per tokenizer.
_INCOMPLETE: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _incomplete_tokens(tokenizer: Any) -> list[int]:
    """Ids of the tokens whose text ends inside a UTF-8 character (decodes to a trailing U+FFFD)."""
    try:
        with _LOCK:
            known = _INCOMPLETE.get(tokenizer)
    except TypeError:  # not weakly referenceable: no cache
        known = None
    if known is not None:
        return known
    try:
        words = tokenizer.batch_decode([[token] for token in range(len(tokenizer))])
    except Exception as error:  # anything a tokenizer-like object raises
        raise TypeError(f"`tokenizer` must be a transformers tokenizer (len() and batch_decode), got "
                        f"{type(tokenizer).__name__}: {error}") from None
    found = [token for token, word in enumerate(words) if word.endswith("\ufffd")]
    try:
        with _LOCK:
            _INCOMPLETE[tokenizer] = found
    except TypeError:
        pass
    return found
