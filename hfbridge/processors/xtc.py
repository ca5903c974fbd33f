"""XTC, "exclude top choices", as a `transformers.LogitsWarper`-style `LogitsProcessor`.

Definition (per row): with probability `probability`, if two or more tokens have probability
`p >= threshold`, remove all of them but the least likely one; if that would leave fewer than
`min_tokens_to_keep` tokens, the row is left unchanged. Probabilities are the softmax of the
scores the warper receives (tokens already at `-inf` have none). Among tokens of exactly equal
score at the boundary, the one with the highest id is kept.

Reference: llama.cpp `src/llama-sampler.cpp`, `llama_sample_xtc_apply` (the sampler was designed
by p-e-w for text-generation-webui, PR #6335); defaults from `common/common.h`:
`xtc_probability = 0.0` (off), `xtc_threshold = 0.1`. llama.cpp skips the sampler when
`threshold > 0.5` (no two tokens can both be above it), which the definition gives anyway.
text-generation-webui also never removes the newline and EOS tokens ("special tokens"); llama.cpp
does not, nor does this class.

Randomness: one uniform number per row and call, from `generator` when given (a
`torch.Generator` on the scores' device), else from torch's global RNG. A row applies XTC when its
number is `< probability` (so 1.0 always, 0.0 never).

Batched and sync-free: at most `floor(1 / threshold) + 1` tokens can have `p >= threshold`, so one
`topk` of that size, the row's log-normaliser and one scatter do the work.

>>> import torch
>>> scores = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
>>> XTCLogitsWarper(threshold=0.19, probability=1.0)(None, scores).exp()
tensor([[0.0000, 0.0000, 0.2000, 0.1000]])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LogitsProcessor

from hfbridge.processors._cpu_side import fused_path, scores_owned, scratch
from hfbridge.processors._rows import RowParam, best_k, described, token_label

__all__ = ["XTCCoin", "XTCLogitsWarper"]


@dataclass(frozen=True)
class XTCCoin:
    """What XTC did to one row at its last call (`XTCLogitsWarper.describe_last`).

    Attributes:
        coin: The row's uniform number.
        probability: The row's ``probability``: XTC fires when ``coin < probability``.
        threshold: The row's ``threshold``.
        fired: Whether the coin fired.
        top: The top choices (``p >= threshold``), most likely first.
        removed: The ones removed (all but the least likely of ``top`` when it fired; none otherwise, or
            when that would leave fewer than ``min_tokens_to_keep`` tokens).
    """

    coin: float
    probability: float
    threshold: float
    fired: bool
    top: list[int]
    removed: list[int]

    @property
    def tokens(self) -> list[int]:
        return self.removed

    def text(self, label: Callable[[int], str] = token_label) -> str:
        """One line: the coin, and what it removed."""
        coin = f"coin {self.coin:.3f} {'<' if self.fired else '>='} {self.probability:g}"
        if not self.fired:
            return f"{coin}: did not fire"
        top = f"{len(self.top)} token{'s' if len(self.top) != 1 else ''} at p >= {self.threshold:g}"
        if not self.removed:
            return f"{coin}: fired; {top}, nothing removed"
        kept = [token for token in self.top if token not in self.removed]
        return (f"{coin}: fired; {top}: removed {', '.join(label(t) for t in self.removed)}"
                + (f", kept {label(kept[0])}" if kept else ""))


class XTCLogitsWarper(LogitsProcessor):
    """Exclude top choices (see the module).

    Args:
        threshold: Tokens with `p >= threshold` are the "top choices", in (0, 1]. Default: 0.1.
        probability: Chance per row and step that XTC applies, in [0, 1]. Default: 0.5.
        min_tokens_to_keep: A row that would keep fewer tokens is left unchanged (int >= 1). Default: 1.
        generator: A `torch.Generator` for the per-row coin. Default: the global RNG.
        filter_value: The score of a removed token. Default: -inf.
    """

    keeps_ids_intact = True  # traits (`hfbridge.processors._traits`): keeps no ids
    reads_ids = False  # nor reads them: an engine may skip building the histories
    sampler_name = "xtc"

    def __init__(self, threshold: Any = 0.1, probability: Any = 0.5, min_tokens_to_keep: int = 1,
                 generator: torch.Generator | None = None, filter_value: float = -float("inf")):
        self.threshold = RowParam("threshold", threshold, above=0.0, maximum=1.0)
        self.probability = RowParam("probability", probability, minimum=0.0, maximum=1.0)
        if isinstance(min_tokens_to_keep, bool) or not isinstance(min_tokens_to_keep, int) or min_tokens_to_keep < 1:
            raise ValueError(f"`min_tokens_to_keep` must be an int >= 1, got {described(min_tokens_to_keep)}.")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"`generator` must be a torch.Generator, got {type(generator).__name__}.")
        self.min_tokens_to_keep = min_tokens_to_keep
        self.generator = generator
        self.filter_value = filter_value
        # at most floor(1 / t) tokens have p >= t; one more guards the float rounding of the sum
        self._top = math.floor(1.0 / min(self.threshold.values)) + 1
        self._last: tuple[torch.Tensor, ...] | None = None

    def __call__(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        rows, vocab = scores.shape  # [B, V]
        if self.probability.all(lambda p: p == 0.0) or vocab < 2:
            self._last = None
            return scores
        device = scores.device
        coin = torch.rand(rows, device=device, generator=self.generator)  # [B], one number per row and call
        applies = coin < self.probability.tensor(rows, device)  # [B]
        top = min(vocab, self._top + self.min_tokens_to_keep - 1)
        values, ids = best_k(scores, top)  # [B, K], descending
        if fused_path(scores):  # torch's fused softmax into a scratch buffer, read at the K best only
            probs = torch.softmax(scores, -1, out=scratch(scores)).gather(1, ids)  # [B, K]
        else:
            best = values[:, :1]  # [B, 1]
            shifted = scores - best
            total = shifted.exp_().sum(-1, keepdim=True)  # [B, 1]: softmax's normaliser, as llama.cpp sums it
            probs = (values - best).exp() / total  # [B, K]
        above = probs >= self.threshold.tensor(rows, device, scores.dtype)[:, None]  # a prefix of the K
        count = above.sum(-1)  # [B]
        # the least likely above the threshold stays: ties with it keep the highest token id
        lowest = torch.where(above, values, torch.inf).amin(-1, keepdim=True)
        tied = above & (values == lowest)
        kept = torch.where(tied, ids, -1).amax(-1, keepdim=True)
        remove = above & (ids != kept)  # count - 1 tokens
        if self.min_tokens_to_keep > 1:
            # after removing count - 1 tokens, min_tokens_to_keep must still be finite
            needed = count - 1 + self.min_tokens_to_keep - 1  # [B] 0-based rank of the last one to keep
            finite = values.gather(1, needed.clamp(max=top - 1)[:, None]).squeeze(1) > -torch.inf
            enough = (needed < top) & finite  # a vocabulary narrower than that has too few tokens
        else:
            enough = torch.ones_like(applies)
        remove &= (applies & (count >= 2) & enough)[:, None]
        self._last = (coin, applies, ids, above, remove)  # what `describe_last` reads: references, no work
        replaced = torch.where(remove, torch.full_like(values, self.filter_value), values)  # [B, K]
        return scores.scatter_(1, ids, replaced) if scores_owned() else scores.scatter(1, ids, replaced)

    def describe_last(self, input_ids: torch.Tensor | None = None) -> list[XTCCoin | None]:
        """What the last call did to each row: its coin, whether XTC fired, the top choices it removed.

        Read from tensors the call kept (no work in a step; the host reads happen here). A row gets None
        when the last call drew no coin (``probability`` 0 everywhere, or one token), or when
        ``input_ids`` `(rows, seq)` has another number of rows than that call (it ran on another batch).

        >>> warper = XTCLogitsWarper(threshold=0.19, probability=1.0)
        >>> _ = warper(None, torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log())
        >>> warper.describe_last()[0].removed
        [0, 1]
        """
        if self._last is None:
            return [None] * (1 if input_ids is None else input_ids.shape[0])
        coin, applies, ids, above, remove = (t.tolist() for t in self._last)
        if input_ids is not None and input_ids.shape[0] != len(coin):
            return [None] * input_ids.shape[0]
        thresholds, probabilities = self.threshold.for_rows(len(coin)), self.probability.for_rows(len(coin))
        return [XTCCoin(coin[row], float(probabilities[row]), float(thresholds[row]), applies[row],
                        [t for t, a in zip(ids[row], above[row]) if a], [t for t, r in zip(ids[row], remove[row]) if r])
                for row in range(len(coin))]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(threshold={self.threshold}, probability={self.probability}, "
                f"min_tokens_to_keep={self.min_tokens_to_keep})")
