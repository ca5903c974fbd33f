"""One request's tokens (prompt, then output) as a growing tensor, appended to, never rebuilt.

vLLM hands a logits processor the request's prompt ids once and a live reference to its output ids
list, which vLLM extends after each step. `History.sync` appends only the tokens added since the
last call (amortised O(1) per token: the buffer doubles when full), so a long request costs no more
per step than a short one. With async scheduling vLLM first appends a placeholder (-1) and replaces
it before the logits are processed; placeholders are never read, and a list that shrank (tokens
discarded) is followed.

>>> output = [7]
>>> history = History([3, 4, 5], output)
>>> history.tokens().tolist(), history.prompt_length, history.output_length
([3, 4, 5, 7], 3, 1)
>>> output += [8, -1]
>>> history.sync()
>>> history.tokens().tolist()
[3, 4, 5, 7, 8]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_PLACEHOLDER = -1


class History:
    """A request's token ids so far, on `device`; see the module.

    Args:
        prompt: The prompt's token ids.
        output: vLLM's list of the request's output ids (read, never written).
        device: Where the ids live (the logits' device).
    """

    def __init__(self, prompt: Sequence[int], output: Sequence[int], device: torch.device | str = "cpu"):
        self._output = output
        self.prompt_length = len(prompt)
        self._buffer = torch.empty(max(16, 2 * (len(prompt) + len(output))), dtype=torch.long, device=device)  # [C]
        self._buffer[: self.prompt_length] = torch.as_tensor(list(prompt), dtype=torch.long)
        self.length = self.prompt_length
        self.sync()

    @property
    def output_length(self) -> int:
        """Output tokens in the history (placeholders not counted)."""
        return self.length - self.prompt_length

    def sync(self) -> None:
        """Take in the output tokens vLLM added since the last call (and follow a list that shrank)."""
        output = self._output
        seen = self.output_length
        end = len(output)
        if end == seen:
            return
        if end < seen:  # vLLM discarded tokens
            self.length = self.prompt_length + end
            return
        new = list(output[seen:end])
        if _PLACEHOLDER in new:
            new = new[: new.index(_PLACEHOLDER)]
        if not new:
            return
        needed = self.length + len(new)
        if needed > self._buffer.shape[0]:
            grown = torch.empty(2 * needed, dtype=torch.long, device=self._buffer.device)
            grown[: self.length] = self._buffer[: self.length]
            self._buffer = grown
        self._buffer[self.length:needed] = torch.as_tensor(new, dtype=torch.long)
        self.length = needed

    def tokens(self) -> torch.Tensor:
        """`(length,)` the ids so far (a view: valid until the next `sync`)."""
        return self._buffer[: self.length]
