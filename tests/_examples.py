"""Run a README or docs example as a user would, with every warning an error.

Python warnings (a `FutureWarning` of a renamed transformers keyword) raise; transformers' logged
deprecations (logged, not warned, on some releases) fail the example too. Its other log lines (the
oldest releases log a note when generate fills in a pad token) are HF's own behaviour, not our examples'.
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
        if "deprecat" in record.getMessage().lower():
            self.messages.append(record.getMessage())


def run_example(code: str, filename: str) -> None:
    """Execute `code` in a fresh namespace; fail on any Python warning or deprecation transformers logs."""
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
    assert not records.messages, f"{filename}: transformers logged deprecations {records.messages}"
