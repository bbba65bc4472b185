"""What the control socket asks of the daemon: the ``Backend`` of :mod:`supervisor.control.methods`.

Status with each tree's usage and per-client instances, start, stop and restart under the
name's lock, tools, calls, logs, pins approved, health.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import replace
from typing import Any

import anyio
import mcp_types as types
import structlog
from mcp.shared.dispatcher import ProgressFnT

from supervisor.config.extension import RemoteConfig
from supervisor.daemon.health import cgroup_of, process_stats
from supervisor.dashboard.passes import CODE_TTL
from supervisor.errors import SupervisorError, UnknownExtension
from supervisor.extension.instances import Instances, figures
from supervisor.extension.state import Snapshot, State
from supervisor.extension.supervised import Extension
from supervisor.process import sandbox
from supervisor.process import usage as resources
from supervisor.remote import explain as remote_explain

__all__ = ("Facade",)

log = structlog.get_logger(__name__)


class Facade:
    """The control methods, as part of the Daemon (its ``_extensions``, ``_instances``, ``gateway``, ...)."""

    def status(self, name: str | None = None) -> list[Snapshot]:
        chosen = [self.get(name)] if name is not None else self._extensions.values()
        return [self._with_instances(ext) for ext in chosen]

    def _with_instances(self, ext: Extension) -> Snapshot:
        snapshot = self._with_usage(ext)
        instances = self._instances.get(ext.name)
        if instances is None or ext.config.instances != "per-client":
            return snapshot
        return replace(snapshot, instances=tuple(self._with_usage(i) for i in instances.all()))

    def _with_usage(self, ext: Extension) -> Snapshot:
        snapshot = ext.snapshot()
        usage = self.usage.usage(snapshot.name, snapshot.pid, ext.run_marker)
        return replace(snapshot, resources=usage.as_dict())

    async def start(self, name: str, *, wait: bool = True) -> Snapshot:
        async with self._exclusive(name) as ext:
            self._instances[name].resume()  # per-client: clients' next calls start theirs
            await ext.start(self._tg)
        return await _settled(ext) if wait else ext.snapshot()

    async def stop(self, name: str, *, wait: bool = True) -> Snapshot:
        async with self._exclusive(name) as ext:
            instances = self._instances[name]  # per-client: every instance too, held until start
            if wait:
                async with anyio.create_task_group() as stoppers:
                    stoppers.start_soon(ext.stop)
                    stoppers.start_soon(functools.partial(instances.stop_all, hold=True))
            else:
                ext.request_stop()  # the watchers do the rest: no task per request
                instances.held = True
                instances.release_all()
        return ext.snapshot()

    async def restart(self, name: str, *, wait: bool = True) -> Snapshot:
        if not wait:
            snapshot = self.get(name).snapshot()
            if name not in self._restarting:  # one waiting at most: a loop of requests is one restart
                self._restarting.add(name)
                self._tg.start_soon(self._restart_soon, name)
            return snapshot
        ext = await self._restart(name)
        if ext is None:
            raise UnknownExtension(name)
        return await _settled(ext)

    async def _restart_soon(self, name: str) -> None:
        try:
            await self._restart(name)
        finally:
            self._restarting.discard(name)

    async def _restart(self, name: str) -> Extension | None:
        """Restart *name*; None if a reload removed it meanwhile. Never raises: may run as a task."""
        with contextlib.suppress(UnknownExtension):
            async with self._exclusive(name) as ext, anyio.create_task_group() as restarts:
                restarts.start_soon(ext.restart, self._tg)
                restarts.start_soon(self._instances[name].restart_all, self._tg)  # per-client: each
            return ext
        return None

    async def login(self, name: str, *, device: bool = False) -> dict[str, Any]:
        """Start a login of remote extension *name* (or join the one under way): its authorization
        URL for a person to open (*device*: and the code to enter there), or why it ended first."""
        ext = self.get(name)
        on_success = functools.partial(self._logged_in, name)
        attempt = await self.logins.begin(
            self._tg, name, ext.config, ext.credentials_dir, on_success, device=device
        )
        if attempt.url is None and attempt.error is not None:
            raise SupervisorError(attempt.error)
        return {"url": attempt.url, "user_code": attempt.user_code, "done": attempt.done.is_set()}

    async def login_url(self, name: str) -> str | None:
        """The authorization URL of the login of *name* under way (started if none is): for a
        client that opens URLs (URL-mode elicitation). None where it ended without one."""
        with contextlib.suppress(SupervisorError):
            return (await self.login(name))["url"]  # type: ignore[no-any-return]
        return None

    async def login_wait(self, name: str, patience: float) -> Snapshot:
        """Wait up to *patience* s for the login of *name* under way; its status once it started again."""
        ext = self.get(name)
        attempt = self.logins.attempt(name)
        if attempt is not None:
            with anyio.move_on_after(patience):
                await attempt.done.wait()
            if not attempt.done.is_set():
                raise SupervisorError(f"the login of {name!r} is still waiting for its person")
            if attempt.error is not None:
                raise SupervisorError(attempt.error)
        return await ext.wait_for(lambda s: s.state not in (State.STARTING, State.STOPPING, State.BACKOFF))

    async def _logged_in(self, name: str) -> None:
        """A login succeeded: the extension (and each per-client instance) runs with it, unless stopped."""
        with contextlib.suppress(UnknownExtension):
            if self.get(name).state is not State.STOPPED:
                await self._restart(name)

    async def logout(self, name: str) -> dict[str, Any]:
        """Revoke and forget the login of *name*; a run of it ends (the next wants a login)."""
        ext = self.get(name)
        revoked = await self.logins.log_out(name, ext.config)
        if ext.state is not State.STOPPED:
            await self._restart(name)
        return {"revoked": revoked, "status": ext.snapshot().as_dict()}

    async def dashboard(self, *, read_only: bool = False) -> dict[str, Any]:
        """The dashboard's URL with a new one-time code; the HTTP listener opens now if it is not open.

        Raises:
            SupervisorError: the config turns the dashboard off, or its address cannot be bound.
        """
        if not self.settings.dashboard.enabled:
            raise SupervisorError("the dashboard is off in the config (dashboard.enabled: false)")
        if self.web is None:
            raise SupervisorError("the daemon is still starting; try again in a moment")
        listening = await self.web.open(mcp=False)
        host = self.settings.gateway.http.host
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # bound to all: visit one
        host = f"[{host}]" if ":" in host else host
        code = self.dashboard_app.passes.issue(read_only=read_only)
        return {
            "url": f"http://{host}:{listening.port}/dashboard/login?code={code}",
            "read_only": read_only or self.settings.dashboard.read_only,
            "expires_in": CODE_TTL,
        }

    def tools(self, name: str | None = None) -> list[tuple[str, types.Tool]]:
        chosen = [self.get(name)] if name is not None else self._extensions.values()
        return [(ext.name, tool) for ext in chosen for tool in ext.tools()]

    def exposed(self, extension: str, tool: str) -> tuple[str | None, str | None]:
        return self.gateway.exposed(extension, tool)

    def collisions(self, extension: str) -> list[str]:
        return self.gateway.collisions(extension)

    def clients(self) -> list[dict[str, Any]]:
        return self.gateway.clients()

    def recent_calls(self) -> dict[str, Any]:
        return self.metrics.recent.series(list(self._extensions))

    def profiles(self) -> list[dict[str, Any]]:
        return self.gateway.profiles()

    async def call(
        self, name: str, tool: str, arguments: dict[str, Any], *, progress: ProgressFnT | None = None
    ) -> types.CallToolResult:
        return await self.get(name).call_tool(tool, arguments, progress=progress)

    def logs(self, name: str, lines: int) -> list[str]:
        return self.get(name).logs(lines)

    async def explain(self, name: str) -> list[str]:
        """``check-config --explain``, as this daemon confines *name*: its environment, state and
        spool, not those of the shell that asks. In a thread: it reads the file system."""
        config = self.get(name).config
        if isinstance(config, RemoteConfig):
            return remote_explain.explain(name, config)
        return await anyio.to_thread.run_sync(sandbox.explain_extension, name, config, self.sandbox_context)

    def tool_changes(self, name: str, *, texts: bool = False) -> list[dict[str, Any]]:
        """The tools of *name* whose definition changed since it was pinned (see :mod:`.pins`);
        with *texts*, the pinned definition and the current one (where known)."""
        self.get(name)
        return [change.as_dict(texts=texts) for change in self._pins[name].changes().values()]

    async def approve(self, name: str, tool: str | None = None) -> list[str]:
        """Pin the current definition of *tool* of *name* (None: of each changed one); those approved."""
        self.get(name)
        pins = self._pins[name]
        approved = pins.approve(tool)
        await pins.save()
        self.changes.bump()
        return approved

    def health(self) -> dict[str, Any]:
        """Diagnostics of the daemon itself: the process, the spool, and each extension's counters."""
        spool = self.spool.stats()
        return {
            "config": self.config_path,  # the file reload reads (None: settings given in code)
            "process": process_stats().as_dict(),
            "spool": {
                "dir": str(self.spool.run_dir),
                "files": spool.files,
                "bytes": spool.bytes,
                "max_files": self.spool.max_files,
                "max_bytes": self.spool.max_total_bytes,
            },
            "containment": self.containment.describe() if self.containment else None,
            "start_slots": self.start_slots.stats(),
            "dashboard": self.dashboard_app.figures(),
            "gateway": {"fast_calls": len(self.gateway.calls)},  # plain calls running, every listener
            "extensions": [
                _health_of(ext, self.usage, self._instances.get(ext.name))
                for ext in self._extensions.values()
            ],
        }

    def metrics_text(self) -> str:
        """``health``'s figures and the calls' counters in the Prometheus text format."""
        return self.metrics.render()


def _health_of(
    ext: Extension, usage: resources.Sampler, instances: Instances | None = None
) -> dict[str, Any]:
    snapshot = ext.snapshot()
    per_client = instances if ext.config.instances == "per-client" else None
    return {
        **figures(ext, usage),
        "tools": snapshot.tools,
        "log_lines": ext.stderr_lines,
        "log_lines_max": ext.config.log_lines,
        "cgroup": cgroup_of(snapshot.pid) if snapshot.pid else None,
        "instances": per_client.health(usage) if per_client is not None else None,
        "sandbox": snapshot.sandbox,
    }


async def _settled(ext: Extension) -> Snapshot:
    """Wait until a start has an answer: running, or why not (backoff, failed, stopped)."""
    return await ext.wait_for(lambda s: s.state not in (State.STARTING, State.STOPPING))
