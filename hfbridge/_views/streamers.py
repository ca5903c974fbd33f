"""`NotebookStreamer`: HF's `TextStreamer` for Jupyter, as one growing output instead of many.

`TextStreamer` prints each finished word with ``flush=True``. A live notebook joins those prints
into one block, but a notebook run by nbclient (``jupyter nbconvert --execute``, CI) stores every
flush as an output of its own, and the exported HTML shows one word per line. This streamer puts
the text in one display and updates it in place: the same live effect, one block when saved.
"""

from __future__ import annotations

from typing import Any

from transformers import TextStreamer

__all__ = ["NotebookStreamer"]


class NotebookStreamer(TextStreamer):
    """A `transformers.TextStreamer` that shows the text in one notebook output, updated in place.

    Words are released exactly as `TextStreamer` releases them (the prompt first unless
    ``skip_prompt``, then each word once complete). In a Jupyter kernel they go into one
    plain-text display that grows; anywhere else they are printed, as `TextStreamer` prints them.
    Each ``generate`` call (each ``end()``) starts a new display.

    Args:
        tokenizer: The tokenizer that decodes the tokens.
        skip_prompt: Leave the prompt out. Default: ``False``.
        **decode_kwargs: Passed to ``tokenizer.decode`` (for example ``skip_special_tokens=True``).

    >>> from hfbridge.demo import load_demo_tokenizer
    >>> tok = load_demo_tokenizer()
    >>> streamer = NotebookStreamer(tok)
    >>> streamer.put(tok("A ship sails", return_tensors="pt").input_ids); streamer.end()   # no kernel: prints
    A ship sails
    >>> streamer.text
    'A ship sails'
    """

    def __init__(self, tokenizer: Any, skip_prompt: bool = False, **decode_kwargs: Any):
        super().__init__(tokenizer, skip_prompt=skip_prompt, **decode_kwargs)
        self.text = ""  # everything streamed since the last end()
        self._handle: Any = None
        self._finished = False

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        if self._finished:  # the first words of a new generation: a new display
            self.text, self._handle, self._finished = "", None, False
        self.text += text
        self._finished = stream_end
        display = _kernel_display()
        if display is None:
            super().on_finalized_text(text, stream_end=stream_end)
            return
        content = {"text/plain": self.text}
        if self._handle is None:
            if self.text:  # no empty output before the first word
                self._handle = display(content, raw=True, display_id=True)
        elif text:
            self._handle.update(content, raw=True)


def _kernel_display() -> Any:
    """IPython's ``display`` when running in a Jupyter kernel, else ``None``."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return None
    shell = get_ipython()
    return display if shell is not None and getattr(shell, "kernel", None) is not None else None
