"""`generate`'s banned strings: the one-token loop's hook around `BannedStrings` (`banned.py`).

`generate(..., banned_strings=[...], banned_regex=[...], banned_max_rewinds=32, tokenizer=tok)` takes
these options out of `**kwargs` (`split_banned`); the loop (`loop.py`) then calls, at every step:

1. `before_choose`: -inf on the tokens already tried at this position (on a copy of the model's
   logits, before every processor: as if the model had never proposed them); the generators of the
   rows that replay their own tokens are saved;
2. `after_choose`: those rows get their own token back, and their generators their state (a row's
   draws do not depend on the rest of the batch);
3. `after_step` (after the stopping criteria): one host read of the new tokens and the finished
   rows; when a row's text holds a decided match, the whole batch is cut back to the earliest
   position a row rolls back to: the sequences, the mask, the scores kept for the output, the
   model's cache (`adapter.crop`, the protocol assisted decoding uses), the stateful processors
   (`rollback(lengths)`) and the finished rows (a row that finished after that position is
   unfinished again). The rows that did not roll back there replay their tokens from it.

A streamer receives a step's tokens only once no row can take them back (columns of the batch, in
order, as a plain run sends them), and the rest when the loop ends: it never shows text that is later
taken back, and shows in the end exactly the returned sequences.

Beam search, assisted decoding, guidance and `synced_gpus` are refused before any model call.

>>> split_banned({"banned_strings": ["delve"], "top_k": 5})
({'top_k': 5}, {'strings': ['delve'], 'regex': None, 'max_rewinds': 32})
"""

from __future__ import annotations

from typing import Any

import torch

from hfbridge._generate.banned import DEFAULT_MAX_REWINDS, BannedStrings
from hfbridge._models.adapters import ModelAdapter

__all__ = ["OPTIONS", "BannedLoop", "split_banned"]

# generate's keyword -> BannedStrings' argument
OPTIONS = {"banned_strings": "strings", "banned_regex": "regex", "banned_max_rewinds": "max_rewinds"}


def split_banned(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """`kwargs` without the banned-strings options, and those options (None when no ban is given)."""
    if not any(name in kwargs for name in OPTIONS):
        return kwargs, None
    rest = {name: value for name, value in kwargs.items() if name not in OPTIONS}
    options = {argument: kwargs.get(name) for name, argument in OPTIONS.items()}
    if options["max_rewinds"] is None:
        options["max_rewinds"] = DEFAULT_MAX_REWINDS
    if options["strings"] is None and options["regex"] is None:
        if "banned_max_rewinds" in kwargs:
            raise ValueError("`banned_max_rewinds` bounds the rollbacks of `banned_strings` / `banned_regex`; pass "
                             "one of them too, or drop it.")
        return rest, None
    return rest, options


def make_bans(options: dict[str, Any] | None, tokenizer: Any, *, strategy: str | None) -> BannedStrings | None:
    """The call's `BannedStrings` (checked before any model call), or None; `strategy` names a refused one."""
    if options is None:
        return None
    if tokenizer is None and not isinstance(options["strings"], BannedStrings):
        raise ValueError("`banned_strings` / `banned_regex` need `tokenizer=`: the generated tokens are decoded to "
                         "text to find the bans. Pass the tokenizer that made `input_ids`.")
    given = options["strings"]
    if isinstance(given, BannedStrings):  # one of the caller's, to read its `rewinds` afterwards
        if options["regex"] is not None or options["max_rewinds"] != DEFAULT_MAX_REWINDS:
            raise ValueError("`banned_strings` is a BannedStrings, which holds its own patterns and bound; pass "
                             "banned_regex / banned_max_rewinds to BannedStrings(...) instead.")
        bans = given
    else:
        bans = BannedStrings(tokenizer, **options)
    if strategy is not None:
        raise ValueError(f"`banned_strings` / `banned_regex` roll rows back in greedy search and sampling, not in "
                         f"{strategy}; drop one or the other.")
    return bans


def check_adapter(adapter: ModelAdapter) -> None:
    """Refuse, before any model call, an adapter that cannot drop positions from its cache."""
    if type(adapter).crop is ModelAdapter.crop:
        raise TypeError(
            f"`banned_strings` / `banned_regex` roll rows back, which drops positions from the model's cache, but "
            f"{type(adapter).__name__} does not say how (override crop(state, length); return the state unchanged "
            "if the model recomputes the whole sequence)."
        )


class BannedLoop:
    """The hook of one `generate` call (see the module); `streamer` is what the loop should call instead."""

    def __init__(self, bans: BannedStrings, *, rows: int, prompt_length: int, streamer: Any, generator: Any):
        bans.start(rows, prompt_length)
        self.bans = bans
        self.prompt_length = prompt_length
        self.target = streamer  # the caller's streamer, or None
        self.streamer = None if streamer is None else _Held()
        self.generators = list(generator) if isinstance(generator, (list, tuple)) else None
        self.sent = 0  # generated columns sent to the streamer
        self.checked = False  # whether the adapter's state after the first call can be cropped

    def before_choose(self, sequences: torch.Tensor, view: torch.Tensor) -> tuple[torch.Tensor, list]:
        """The step's logits `(rows, vocab)` with the tried tokens forbidden; the replaying rows' generator states."""
        view = self.bans.mask(sequences.shape[1], view)
        saved = []
        if self.generators is not None:
            saved = [(row, self.generators[row].get_state()) for row in self.bans.forced_rows()]
        return view, saved

    def after_choose(self, sequences: torch.Tensor, tokens: torch.Tensor, saved: list) -> torch.Tensor:
        """`tokens` `(rows,)` with the replaying rows' own tokens; their generators as before the draw."""
        for row, state in saved:
            assert self.generators is not None
            self.generators[row].set_state(state)
        return self.bans.force(sequences.shape[1], tokens)

    def named(self, step: int, row: int, length: int, processors: list[str]) -> ValueError | None:
        """The error for row `row` left with nothing to choose at sequence length `length` when bans forbade tokens
        there (the processors removed every other one: a thinking budget forcing banned text); None otherwise."""
        rewinds = self.bans.forbidding(row, length)
        if not rewinds:
            return None
        bans = " and ".join(dict.fromkeys(f"the banned {kind} {rewind.ban!r}" for kind, rewind in rewinds))
        tokens = ", ".join(f"{rewind.token} ({self.bans.tokenizer.decode([rewind.token])!r})" for _, rewind in rewinds)
        forced = ""
        if "ThinkingBudgetLogitsProcessor" in processors:
            forced = (" `thinking_budget` ran out: ThinkingBudgetLogitsProcessor forces the end of thinking here "
                      "(`thinking_end`, after `thinking_budget_message` if any), which the ban forbids.")
        plural = "tokens" if len(rewinds) > 1 else "token"
        return ValueError(
            f"generate(): at step {step}: row {row} has nothing left to choose at position {length}: {bans} "
            f"forbade {plural} {tokens} there after a rollback, and the logits processors {processors} removed "
            f"every other token.{forced} Drop the ban, or the option that forces the banned text."
        )

    def after_step(self, call: Any, adapter: ModelAdapter, finished: Any, stop: bool, bar: Any) -> bool:
        """Check the new tokens; roll back when a row holds a ban. Returns whether the loop stops now."""
        if not self.checked:
            adapter.check_crop(call.state)  # a Hooks state it cannot crop: said at the first step, not the first ban
            self.checked = True
        read = torch.stack([call.sequences[:, -1], finished.unfinished.to(call.sequences.dtype)]).tolist()
        length = call.sequences.shape[1]
        final = finished.max_length is not None and length >= finished.max_length
        cut = self.bans.observe(read[0], [bool(flag) for flag in read[1]], final=final)
        if cut is not None:
            self._roll_back(call, adapter, finished, cut)
            if bar is not None:
                bar.update(cut - length)
            stop = False
        self._send(call.sequences, self.bans.committed())
        return stop

    def _roll_back(self, call: Any, adapter: ModelAdapter, finished: Any, cut: int) -> None:
        taken = call.sequences.shape[1] - cut
        call.sequences = call.sequences[:, :cut]
        call.mask = call.mask[:, :cut]
        if call.scores is not None:
            call.scores = call.scores[: len(call.scores) - taken]
        if call.raw_logits is not None:
            call.raw_logits = call.raw_logits[: len(call.raw_logits) - taken]
        # the next call feeds the last kept token and gives the logits of position `cut`
        call.state = adapter.crop(call.state, cut - 1)
        lengths = torch.full((call.sequences.shape[0],), cut, dtype=torch.long, device=call.sequences.device)
        call.sampler.rollback(lengths)  # every stateful processor, per-row groups with their own rows
        finished.rewind(torch.tensor(self.bans.live_rows(), dtype=torch.bool, device=call.sequences.device))

    def _send(self, sequences: torch.Tensor, upto: int) -> None:
        """Send the generated columns `[sent, upto)` to the caller's streamer."""
        if self.target is None:
            return
        for index in range(self.sent, upto):
            self.target.put(sequences[:, self.prompt_length + index].cpu())
        self.sent = max(self.sent, upto)

    def flush(self, sequences: torch.Tensor) -> None:
        """Send what the streamer has not received yet (the loop has ended: nothing can be taken back)."""
        self._send(sequences, sequences.shape[1] - self.prompt_length)


class _Held:
    """What the loop calls instead of the streamer: `BannedLoop` sends the columns once they are final."""

    def put(self, value: Any) -> None:
        pass

    def end(self) -> None:
        pass
