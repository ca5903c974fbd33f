"""Run a README or docs example as a user would, with every warning an error.

Python warnings (a `FutureWarning` of a renamed transformers keyword) raise; transformers' own log
warnings (its deprecations are logged, not warned, on some releases) fail the example too.
"""

from __future__ import annotations

import logging
import warnings

from transformers.utils import logging as hf_logging


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_example(code: str, filename: str) -> None:
    """Execute `code` in a fresh namespace; fail on any warning, Python's or transformers' log."""
    records = _Records()
    logger = hf_logging.get_logger("transformers")
    verbosity = hf_logging.get_verbosity()
    logger.addHandler(records)
    hf_logging.set_verbosity_warning()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            exec(compile(code, filename, "exec"), {})
    finally:
        logger.removeHandler(records)
        hf_logging.set_verbosity(verbosity)
    assert not records.messages, f"{filename}: transformers logged {records.messages}"
