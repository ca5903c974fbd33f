"""`BannedStrings`: take back the tokens of a banned string or pattern, forbid what was tried, go on.

After every token, each row's generated text is brought up to date (a window of its last tokens decoded:
`banned_decode.py`) and checked (`banned_text.py`). When it holds
a decided match, the row rolls back to the token where the match began, the token it had chosen there
is forbidden at that position (with every token tried there before), and generation goes on from
there: a row never keeps a banned string. This is exllamav2's `banned_strings` (a checkpoint where a
partial match begins; on a full match, rewind and block the tokens explored there) and koboldcpp's
anti-slop, for any model.

A batch rolls back as one: the sequences (and the model's cache) are cut to the earliest position
any row rolls back to, and every other row replays its own tokens up to where it was (each replayed
token comes from a model call at the same position with the same context as the first time, so it is
the token it replaced). A row's tokens are therefore what it would make alone; with one generator per
row, `generate` keeps a replaying row's generator untouched.

The forbidden tokens of a position are forgotten when a row rolls back before it (they were tried
after another prefix). At most `max_rewinds` rollbacks go to one position; one more raises a
`ValueError` naming the row, the position and the ban.

In a loop of your own (no cache, or crop yours to `input_ids.shape[1] - 1` positions when the
sequence got shorter):

>>> import torch
>>> from tokenizers import Tokenizer, models, pre_tokenizers, decoders
>>> from transformers import PreTrainedTokenizerFast
>>> vocab = {"a": 0, "b": 1, "c": 2, "d": 3}
>>> raw = Tokenizer(models.WordLevel(vocab, unk_token="a"))
>>> tok = PreTrainedTokenizerFast(tokenizer_object=raw)
>>> bans = BannedStrings(tok, ["b c"], prompt_length=1)      # "b c": the tokens b then c (decode adds spaces)
>>> scores = torch.tensor([[0.0, 1.0, 3.0, 2.0]])             # c > d > b > a, at every step
>>> ids = torch.tensor([[1]])                                  # the prompt "b"
>>> for _ in range(3):
...     ids = bans.advance(ids, bans(ids, scores).argmax(-1))
>>> tok.decode(ids[0]), [(r.position, r.text) for r in bans.rewinds]
('b c c c', [])
>>> bans = BannedStrings(tok, ["c c"], prompt_length=1)    # rolls back to the first c, forbids c there
>>> ids = torch.tensor([[1]])
>>> for _ in range(4):
...     ids = bans.advance(ids, bans(ids, scores).argmax(-1))
>>> tok.decode(ids[0]), [(r.position, r.text) for r in bans.rewinds]
('b d c', [(1, 'c c')])
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
from typing import Any

import torch

from hfbridge._generate.banned_decode import FullText, WindowText, row_text
from hfbridge._generate.banned_text import Ban, Verdict, check_text, compile_bans, strings_screen

__all__ = ["BannedStrings", "Rewind"]

DEFAULT_MAX_REWINDS = 32


@dataclasses.dataclass(frozen=True)
class Rewind:
    """One rollback.

    Attributes:
        row: The row that rolled back.
        position: Its sequence length after the rollback (prompt included): the index of the token
            that was taken back and is now forbidden there.
        token: That token's id.
        text: The text taken back (from the start of that token).
        match: The banned text found.
        ban: The banned string or pattern that matched, as given.
        taken: How many generated tokens the row took back (from ``position`` on).
    """

    row: int
    position: int
    token: int
    text: str
    match: str
    ban: str
    taken: int = 1


class _Row:
    """One row's view: its columns, the text of its real tokens, what is forbidden where."""

    def __init__(self, text: FullText | WindowText) -> None:
        self.columns: list[int] = []  # every generated column (a finished row's padding included)
        self.real: int | None = None  # columns that are real tokens, once the row has finished
        self.ends: list[int] = []  # ends[k]: length of the stable text of the first k + 1 real tokens
        self.clean: list[bool] = []  # clean[k]: that text ended on a whole character
        self.text = text  # the text of its real tokens, kept up to date by decoding a window (banned_decode.py)
        self.pos = 0  # look for matches from this character on
        self.hold = 0  # generated tokens that no rollback can take back any more
        self.marks: list[tuple[int, int]] = []  # (pos, hold) after each column: restored by a rollback
        self.forbidden: dict[int, set[int]] = {}  # generated index -> token ids tried there
        self.tries: dict[int, int] = {}  # generated index -> rollbacks to it
        self.forced: list[tuple[int, tuple[int, int]]] = []  # (token, its marks) to replay, from the next column

    @property
    def live(self) -> bool:
        return self.real is None

    def cut(self, keep: int) -> None:
        """Keep the first `keep` generated columns."""
        del self.columns[keep:]
        if self.real is not None and self.real > keep:
            self.real = None
        del self.ends[keep:]
        del self.clean[keep:]
        del self.marks[keep:]
        self.pos, self.hold = self.marks[-1] if self.marks else (0, 0)


class BannedStrings:
    """Keep banned strings and patterns out of generated text by rolling rows back (see the module).

    `generate(..., banned_strings=[...], banned_regex=[...], tokenizer=tok)` runs one; in a loop of
    your own, call it on each step's scores (it forbids the tokens tried before at this position) and
    `advance` with the chosen tokens.

    Args:
        tokenizer: Decodes token ids to text (`tokenizer.decode(ids)`, as a `TextStreamer` shows them).
        strings: Banned strings: case-insensitive substrings. Default: none.
        regex: Banned regular expressions (the `regex` module's syntax), case-sensitive. Default: none.
        prompt_length: Tokens of each row that are its prompt (never checked, never taken back).
            Default: the length of the first `input_ids` seen.
        max_rewinds: Rollbacks allowed to one position before a `ValueError`. Default: 32.

    Attributes:
        rewinds: Every rollback so far, in order (`Rewind`).
    """

    def __init__(self, tokenizer: Any, strings: Any = None, regex: Any = None, *, prompt_length: int | None = None,
                 max_rewinds: int = DEFAULT_MAX_REWINDS):
        if tokenizer is None or not callable(getattr(tokenizer, "decode", None)):
            raise TypeError(f"banned strings need `tokenizer=` with a decode(ids) method (the tokenizer that made "
                            f"the prompt), got {type(tokenizer).__name__}.")
        self.tokenizer = tokenizer
        self.bans: tuple[Ban, ...] = compile_bans(strings, regex)
        if not self.bans:
            raise ValueError("BannedStrings needs at least one banned string or pattern (`strings` or `regex`).")
        contexts = [ban.context for ban in self.bans]
        # characters before the search's start that a ban may read: the check reads the text from there on
        self._context: int | None = None if None in contexts else max(context or 0 for context in contexts)
        self._text = row_text(tokenizer)
        self._screen = strings_screen(self.bans)  # banned strings only: one search for all of them first
        if isinstance(max_rewinds, bool) or not hasattr(max_rewinds, "__index__") or operator.index(max_rewinds) < 1:
            raise ValueError(f"`banned_max_rewinds` must be an int >= 1 (rollbacks allowed to one position), got "
                             f"{type(max_rewinds).__name__} {max_rewinds!r}.")
        max_rewinds = operator.index(max_rewinds)  # a NumPy integer too
        if prompt_length is not None and (isinstance(prompt_length, bool) or not isinstance(prompt_length, int)
                                          or prompt_length < 0):
            raise ValueError(f"`prompt_length` must be an int >= 0, got {prompt_length!r}.")
        self.max_rewinds = max_rewinds
        self.prompt_length = prompt_length
        self.rewinds: list[Rewind] = []
        self._rows: list[_Row] = []

    def __repr__(self) -> str:
        return f"BannedStrings({', '.join(f'{ban.kind} {ban.source!r}' for ban in self.bans)})"

    # -- a loop of your own ------------------------------------------------------------------------

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """`scores` `(rows, vocab)` with -inf on the tokens already tried at this position (a new tensor
        when any is; `scores` itself is never modified). `input_ids`: `(rows, seq)`, the sequences so far."""
        self._begin(input_ids)
        return self.mask(input_ids.shape[1], scores)

    def advance(self, input_ids: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """The sequences after this step: `input_ids` `(rows, seq)` with `next_tokens` `(rows,)` appended,
        cut back when a row's text now holds a banned match (shorter than `seq + 1` then)."""
        self._begin(input_ids)
        tokens = self.force(input_ids.shape[1], next_tokens)
        sequences = torch.cat([input_ids, tokens[:, None].to(input_ids.dtype)], dim=-1)  # [N, T + 1]
        cut = self.observe(sequences[:, -1].tolist(), None, final=False)
        return sequences if cut is None else sequences[:, :cut]

    # -- the steps, for `generate`'s loop too ------------------------------------------------------

    def start(self, rows: int, prompt_length: int) -> None:
        """Begin a batch of `rows` sequences whose first `prompt_length` tokens are the prompt."""
        self.prompt_length = prompt_length
        self._rows = [_Row(self._text()) for _ in range(rows)]
        self.rewinds = []

    def _begin(self, input_ids: torch.Tensor) -> None:
        if not self._rows:
            self.start(input_ids.shape[0], input_ids.shape[1] if self.prompt_length is None else self.prompt_length)
        if input_ids.shape[0] != len(self._rows):
            raise ValueError(f"BannedStrings follows {len(self._rows)} rows, got input_ids of shape "
                             f"{tuple(input_ids.shape)}; use a new BannedStrings for another batch.")

    def forbidden(self, length: int) -> list[tuple[int, int]]:
        """`(row, token)` pairs forbidden at the position of sequence length `length`."""
        index = length - self._prompt()
        return [(row, token) for row, state in enumerate(self._rows) for token in state.forbidden.get(index, ())]

    def forbidding(self, row: int, length: int) -> list[tuple[str, Rewind]]:
        """`(kind, rollback)` for each rollback whose token is forbidden in `row` at the position of sequence length
        `length`; kind: "string" or "pattern"."""
        tokens = self._rows[row].forbidden.get(length - self._prompt(), set()) if row < len(self._rows) else set()
        kinds = {ban.source: ban.kind for ban in self.bans}
        return [(kinds.get(rewind.ban, "string"), rewind) for rewind in self.rewinds
                if rewind.row == row and rewind.position == length and rewind.token in tokens]

    def mask(self, length: int, scores: torch.Tensor) -> torch.Tensor:
        """`scores` `(rows, vocab)` with -inf where `forbidden(length)` says (a copy when any; else `scores`)."""
        pairs = self.forbidden(length)
        if not pairs:
            return scores
        rows, tokens = zip(*pairs)
        masked = scores.clone()  # [N, V]
        masked[torch.tensor(rows, device=scores.device), torch.tensor(tokens, device=scores.device)] = float("-inf")
        return masked

    def forced_rows(self) -> list[int]:
        """Rows replaying their own tokens at this step."""
        return [row for row, state in enumerate(self._rows) if state.forced]

    def force(self, length: int, tokens: torch.Tensor) -> torch.Tensor:
        """`tokens` `(rows,)` with the replaying rows' own tokens in place (a new tensor when any)."""
        rows = self.forced_rows()
        if not rows:
            return tokens
        values = torch.tensor([self._rows[row].forced[0][0] for row in rows], dtype=tokens.dtype, device=tokens.device)
        out = tokens.clone()
        out[torch.tensor(rows, device=tokens.device)] = values
        return out

    def observe(self, column: list[int], live: list[bool] | None, *, final: bool) -> int | None:
        """Take the step's tokens `column` (one per row, appended); returns the length to cut back to, or None.

        Args:
            column: The token each row got at this step.
            live: Per row, whether it is still unfinished after this step (None: all are). A row that
                finishes here has final text: a match reaching its end is decided.
            final: Every row's text is final (the length limit).
        """
        prompt = self._prompt()
        cuts: dict[int, tuple[int, Ban, int]] = {}  # row -> (generated tokens kept, ban, match start)
        for row, (state, token) in enumerate(zip(self._rows, column)):
            replayed = state.forced.pop(0)[1] if state.forced else None
            was_live = state.live
            state.columns.append(token)
            if was_live and live is not None and not live[row]:
                state.real = len(state.columns)
            if was_live:
                self._decode(state)
            if replayed is not None or not was_live:
                # its own token again (checked the first time), or padding after its end
                state.pos, state.hold = replayed if replayed is not None else (state.pos, len(state.columns))
                state.marks.append((state.pos, state.hold))
                continue
            done = final or not state.live
            verdict = self._check(state, done)
            state.pos = verdict.hold
            state.hold = self._boundary(state, verdict.hold) if not done or verdict.match is not None \
                else len(state.columns)
            state.marks.append((state.pos, state.hold))
            if verdict.match is not None:
                assert verdict.pattern is not None
                cuts[row] = (self._boundary(state, verdict.match), verdict.pattern, verdict.match)
        if not cuts:
            return None
        return prompt + self._roll_back(cuts)

    @staticmethod
    def _boundary(state: _Row, char: int) -> int:
        """How many of the row's tokens lie wholly before character `char`: the token after them is the one in
        which `char` begins (a token that left a character incomplete belongs with the token completing it)."""
        count = bisect.bisect_right(state.ends, char)
        while count > 0 and not state.clean[count - 1]:
            count -= 1
        return count

    @staticmethod
    def _decode(state: _Row) -> None:
        state.text.update(state.columns, len(state.columns) if state.real is None else state.real)
        state.ends.append(state.text.stable_end())
        state.clean.append(state.ends[-1] == state.text.length)  # no character left incomplete

    def _check(self, state: _Row, final: bool) -> Verdict:
        """`check_text` on the row's text from `pos`, reading only the characters the bans may see."""
        if self._context is None:
            return check_text(self.bans, state.text.full(), state.pos, final=final)
        start = max(0, min(state.pos, state.ends[-1]) - self._context)  # ends[-1]: the stable end, just decoded
        view = state.text.view(start)
        if self._screen is not None:
            end = len(view) if final else state.ends[-1] - start
            if self._screen.search(view, state.pos - start, end, partial=not final) is None:
                return Verdict(None, None, start + end)  # what check_text finds: nothing, nothing held
        verdict = check_text(self.bans, view, state.pos - start, final=final)
        return Verdict(None if verdict.match is None else start + verdict.match, verdict.pattern, start + verdict.hold)

    def _roll_back(self, cuts: dict[int, tuple[int, Ban, int]]) -> int:
        """Cut every row back to the earliest kept length; the others replay their tokens. Returns that length."""
        prompt = self._prompt()
        for row, (keep, ban, start) in cuts.items():
            state = self._rows[row]
            tries = state.tries.get(keep, 0) + 1
            token = state.columns[keep]
            text = state.text.full()
            matched = text[start:_match_end(ban, text, start)]
            if tries > self.max_rewinds:
                raise ValueError(
                    f"row {row}: the banned {ban.kind} {ban.source!r} matched {matched!r} again at "
                    f"token position {prompt + keep}, after {self.max_rewinds} rollbacks to that position "
                    f"(banned_max_rewinds={self.max_rewinds}); raise banned_max_rewinds, or ban fewer strings."
                )
            taken = text[stable_start(state, keep):]
            self.rewinds.append(Rewind(row=row, position=prompt + keep, token=token, text=taken,
                                       match=matched, ban=ban.source, taken=len(state.columns) - keep))
            state.tries[keep] = tries
            state.forbidden.setdefault(keep, set()).add(token)
        earliest = min(keep for keep, _, _ in cuts.values())
        for row, state in enumerate(self._rows):
            own = cuts[row][0] if row in cuts else len(state.columns)
            state.forced = list(zip(state.columns[earliest:own], state.marks[earliest:own])) + state.forced
            state.cut(earliest)
            if row in cuts:
                for table in (state.forbidden, state.tries):  # positions after its own cut: another prefix
                    for index in [index for index in table if index > own]:
                        del table[index]
            state.text.update(state.columns, len(state.columns) if state.real is None else state.real)
        return earliest

    def committed(self) -> int:
        """Generated columns no rollback can take back any more, in every row (what a streamer may show)."""
        return min((state.hold for state in self._rows), default=0)

    def live_rows(self) -> list[bool]:
        """Per row, whether it is unfinished (a rollback can make a finished row unfinished again)."""
        return [state.live for state in self._rows]

    def _prompt(self) -> int:
        if self.prompt_length is None:
            raise RuntimeError("BannedStrings has not seen a batch yet: call it or `advance` with input_ids first.")
        return self.prompt_length


def stable_start(state: _Row, keep: int) -> int:
    """The character where generated token `keep` of the row begins."""
    return state.ends[keep - 1] if keep > 0 else 0


def _match_end(ban: Ban, text: str, start: int) -> int:
    found = ban.compiled.match(text, start)
    return found.end() if found is not None else len(text)
