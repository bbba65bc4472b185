"""Logging set-up: structlog events, JSON lines when not on a terminal. Configured once, by the daemon."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import warnings
from typing import Any, TextIO

import structlog
import structlog.tracebacks

__all__ = ("Throttled", "configure", "quiet_sdk_deprecations")


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
    # Every line is one event: Python's warnings go through logging too, not raw to stderr.
    logging.captureWarnings(True)
    # A malformed request is uvicorn's to log, and a client may send thousands a second.
    uvicorn_errors = logging.getLogger("uvicorn.error")
    uvicorn_errors.filters[:] = [_ThrottleRecords()]


def quiet_sdk_deprecations() -> None:
    """Hide the MCP SDK's deprecation warnings: the daemon serves the handshake era on purpose.

    Apart from :func:`configure` because it imports the SDK, which the daemon does only once
    its head start is launched (:mod:`supervisor.daemon.headstart`).
    """
    with contextlib.suppress(ImportError):
        from mcp import MCPDeprecationWarning

        warnings.filterwarnings("ignore", category=MCPDeprecationWarning)


class Throttled:
    """An event a client can cause at will (a refused request), logged at most once per *interval*.

    The first occurrence of each *key* in a window is logged at once; the rest of the window
    is counted and summed up in one more line when it ends (``repeated``), so a flood costs a
    line a second, not a line a request, and nothing goes unseen. At most :data:`MAX_KEYS`
    keys are tracked; others share one. Sync; the summary is scheduled on the running loop.
    """

    MAX_KEYS = 64

    def __init__(self, logger: Any, event: str, *, interval: float = 1.0, level: str = "warning") -> None:
        self._log = getattr(logger, level)
        self._event = event
        self._interval = interval
        self._windows: dict[str, list[Any]] = {}  # key -> [window end, repeats, last fields]

    def __call__(self, key: str = "", **fields: Any) -> None:
        now = time.monotonic()
        if key not in self._windows and len(self._windows) >= self.MAX_KEYS:
            key = "(other)"
        window = self._windows.get(key)
        if window is not None:
            if now < window[0]:
                window[1] += 1
                window[2] = fields
                return
            self._close(key, window)  # ended, its summary not yet written
        window = self._windows[key] = [now + self._interval, 0, fields]
        self._log(self._event, **fields)
        with contextlib.suppress(RuntimeError):  # no loop: the next occurrence writes the summary
            asyncio.get_running_loop().call_later(self._interval, self._close, key, window)

    def _close(self, key: str, window: list[Any]) -> None:
        if self._windows.get(key) is not window:
            return  # summed up already
        del self._windows[key]
        if window[1]:
            self._log(self._event, **window[2], repeated=window[1], seconds=self._interval)


class _ThrottleRecords(logging.Filter):
    """The stdlib's side of :class:`Throttled`: one record per message template per second."""

    def __init__(self, interval: float = 1.0) -> None:
        super().__init__()
        self._interval = interval
        self._until: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        key = str(record.msg)[:200]
        if now < self._until.get(key, 0.0):
            return False
        if len(self._until) >= Throttled.MAX_KEYS:
            self._until = {k: t for k, t in self._until.items() if t > now}
        self._until[key] = now + self._interval
        return True
