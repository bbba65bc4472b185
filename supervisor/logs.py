"""Logging set-up: structlog events, JSON lines when not on a terminal. Configured once, by the daemon."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
import structlog.tracebacks

__all__ = ("configure",)


def configure(*, json: bool | None = None, level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Route structlog and the stdlib (the MCP SDK logs there) to *stream* (default stderr).

    *json* defaults to "the stream is not a terminal": JSON lines for journald and files,
    readable colour-free console lines for a person.
    """
    stream = stream or sys.stderr
    if json is None:
        json = not stream.isatty()
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    # Tracebacks without frame locals: a frame holds secrets (a child's env, a token) that logs must not.
    if json:
        renderer = structlog.processors.JSONRenderer()
        tracebacks = structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        shared.append(structlog.processors.ExceptionRenderer(tracebacks))
    else:  # plain: rich or better-exceptions, when installed, would print the locals of every frame
        renderer = structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,  # structlog.testing.capture_logs must see every logger
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)  # the SDK is chatty at INFO; its warnings still show
