"""What a library logs during a test, where pytest's ``caplog`` cannot see it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def kept_messages(logger_name: str, level: int = logging.WARNING) -> Iterator[list[str]]:
    """The messages that reach the logger ``logger_name``'s handlers inside the block, at
    ``level`` or above: past the logger's filters, as a user's console would show them.

    distributed's loggers do not propagate to the root logger, where ``caplog`` listens.
    """
    messages: list[str] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger, handler = logging.getLogger(logger_name), Kept(level)
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
