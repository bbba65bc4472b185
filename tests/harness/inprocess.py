"""A daemon in the test's own process, with its HTTP listener under limits of the test's."""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from supervisor.config.settings import Settings
from supervisor.daemon import root as daemon_module
from supervisor.gateway.http import HttpLimits, serve_http
from supervisor.process import children as process

__all__ = ("in_process_daemon",)


@contextlib.asynccontextmanager
async def in_process_daemon(
    short_tmp: Path, extensions: dict[str, Any], limits: HttpLimits, config: Path | None = None
) -> AsyncIterator[tuple[daemon_module.Daemon, str]]:
    """A daemon in this process with the HTTP listener under *limits*: the daemon and its /mcp
    URL. With *config*, its settings are written there first (a reload reads them again)."""
    data = {
        "socket": str(short_tmp / "control.sock"),
        "spool": {"dir": str(short_tmp / "spool")},
        "extensions": extensions,
    }
    if config is not None:
        await anyio.Path(config).write_text(json.dumps(data))
    settings = Settings.model_validate(data)
    async with anyio.create_task_group() as tg:
        daemon = daemon_module.Daemon(
            settings, tg=tg, environ=os.environ, config_path=str(config) if config else None
        )
        await tg.start(daemon.gateway.run)
        serve = functools.partial(
            serve_http,
            daemon.gateway,
            host="127.0.0.1",
            port=0,
            token=None,
            metrics=str,
            health=dict,
            limits=limits,
        )
        port = (await tg.start(serve)).port
        try:
            for name in extensions:
                assert (await daemon.start(name)).state.value == "running"
            yield daemon, f"http://127.0.0.1:{port}/mcp"
        finally:
            with anyio.CancelScope(shield=True):
                await daemon.stop_all()
            tg.cancel_scope.cancel()
    assert not process.find_marked(daemon.marker_prefix)
