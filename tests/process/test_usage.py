"""Resources per extension (RSS, CPU, processes of the whole tree) and memory_max."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pydantic
import pytest
from anyio.abc import TaskGroup

from supervisor.cli import render
from supervisor.config.settings import StdioConfig
from supervisor.errors import CallFailed
from supervisor.extension.state import State
from supervisor.extension.supervised import Extension
from supervisor.process.usage import (
    CACHE_SECONDS,
    Sampler,
    cgroup_memory_limit,
    enforce_memory_max,
    run_usage,
)
from tests.harness import Daemon, eventually, extension_settings, fast_config, first_text, running
from tests.harness.timing import fail_after


@pytest.fixture
def daemon(daemons: Callable[..., Daemon]) -> Daemon:
    """A daemon of the test's, configured and started by the test."""
    return daemons(start=False, end="terminate")


pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

MakeExtension = Callable[..., Extension]
MiB = 1024**2


class TestConfig:
    @pytest.mark.parametrize(
        ("value", "size"),
        [
            ("512M", 512 * MiB),
            ("1G", 1024 * MiB),
            ("1.5GiB", 1536 * MiB),
            ("100mb", 100 * MiB),
            (2 * MiB, 2 * MiB),
        ],
    )
    def test_sizes(self, value: object, size: int) -> None:
        assert StdioConfig(command="x", memory_max=value).memory_max == size  # type: ignore[arg-type]

    @pytest.mark.parametrize("value", ["lots", "1P", "-5M", True, 0, "12", 1.5])
    def test_bad_sizes_say_what_is_wrong(self, value: object) -> None:
        with pytest.raises(pydantic.ValidationError, match=r"memory_max\n.*(invalid size|out of range)"):
            StdioConfig.model_validate({"command": "x", "memory_max": value})

    def test_off_by_default(self) -> None:
        assert StdioConfig(command="x").memory_max is None


class TestSampler:
    async def test_whole_tree_is_counted(self, make_extension: MakeExtension, task_group: TaskGroup) -> None:
        """tree.py's server, grandchild and setsid great-grandchild: three processes, their RSS summed."""
        ext = make_extension(fast_config("tree.py"))
        snapshot = await running(ext, task_group)
        pids = json.loads(first_text(await ext.call_tool("pids", {})))
        sampler = Sampler(ext._marker_prefix)
        usage = sampler.usage("fx", snapshot.pid)
        assert usage.processes == 3, (usage, pids)
        one = run_usage(pids["great_grandchild"], "no-such-marker")  # a pid alone: itself
        assert one.processes == 1 and 0 < one.rss_bytes < usage.rss_bytes
        assert usage.rss_bytes > 3 * MiB and usage.cpu_seconds >= 0
        assert sampler.usage("fx", None).processes == 0  # not running: nothing
        await ext.stop()
        assert Sampler(ext._marker_prefix).usage("fx", snapshot.pid).processes == 0

    def test_one_proc_scan_per_cache_period(self) -> None:
        """However many requests and extensions, /proc is read at most once per CACHE_SECONDS."""
        now = [100.0]
        sampler = Sampler("test-nobody:", clock=lambda: now[0])
        for _ in range(50):
            for name in ("a", "b", "c"):
                sampler.usage(name, os.getpid())
        assert sampler.scans == 1
        now[0] += CACHE_SECONDS
        sampler.usage("a", os.getpid())
        assert sampler.scans == 2


class TestReports:
    async def test_status_health_and_metrics_show_each_tree(self, daemon: Daemon) -> None:
        """status --json, health --json and the Prometheus text carry processes, RSS and CPU seconds."""
        daemon.write(
            {"fx": extension_settings("tree.py"), "off": extension_settings("quick.py", autostart=False)}
        )
        daemon.start()
        daemon.wait_state("fx", "running")
        status = daemon.status()
        with fail_after(5):  # a reading is reused for up to CACHE_SECONDS: the wait saw the shim
            while status["fx"]["resources"]["processes"] != 3:
                await anyio.sleep(0.1)
                status = daemon.status()
        tree = status["fx"]["resources"]
        assert tree["processes"] == 3 and tree["rss_bytes"] > 3 * MiB and tree["cpu_seconds"] >= 0
        assert status["off"]["resources"] == {"processes": 0, "rss_bytes": 0, "cpu_seconds": 0.0}
        assert (status["fx"]["unresponsive"], status["fx"]["memory_exceeded"]) == (0, 0)
        health = {e["name"]: e for e in (daemon.request("health"))["extensions"]}
        assert health["fx"]["resources"]["processes"] == 3
        text = (daemon.request("health", {"format": "prometheus"}))["text"]
        assert 'mcp_supervisor_extension_processes{extension="fx"} 3.0' in text
        assert 'mcp_supervisor_extension_rss_bytes{extension="fx"}' in text
        assert 'mcp_supervisor_extension_cpu_seconds_total{extension="fx"}' in text
        assert 'mcp_supervisor_extension_unresponsive_total{extension="fx"} 0.0' in text
        assert 'mcp_supervisor_extension_memory_exceeded_total{extension="off"} 0.0' in text
        table = daemon.cli("status").stdout
        assert "3 proc, RSS" in table

    def test_table_detail(self) -> None:
        record = {
            "name": "fx",
            "state": "running",
            "since": datetime.now(UTC).isoformat(),
            "resources": {"processes": 2, "rss_bytes": 50 * MiB, "cpu_seconds": 1.25},
        }
        assert "2 proc, RSS 50.0 MiB, CPU 1.2s" in render.status_table([record])


class TestMemoryMax:
    async def test_tree_over_the_limit_is_restarted_with_the_error(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """A tool that allocates 200 MiB under memory_max 100M: restarted, and last_error says why."""
        ext = make_extension(fast_config("hang.py", memory_max="100M"))
        first = await running(ext, task_group)
        try:
            assert first_text(await ext.call_tool("alloc", {"mb": 200})) == "allocated"
        except CallFailed as exc:  # loaded, the check (each second) can come before the answer
            assert "memory_max 100 MiB exceeded" in str(exc), exc
        with fail_after(10):  # checked every second; then the teardown
            after = await ext.wait_for(lambda s: s.memory_exceeded == 1 and s.state is not State.RUNNING)
        assert after.last_error is not None
        assert after.last_error.startswith("memory_max 100 MiB exceeded: "), after.last_error
        assert int(after.last_error.rsplit(": ", 1)[1].removesuffix(" MiB")) >= 200
        with fail_after(10):
            again = await ext.wait_for(lambda s: s.state is State.RUNNING and s.pid != first.pid)
        assert again.restarts == 1
        await ext.stop()

    async def test_under_the_limit_is_left_alone(
        self, make_extension: MakeExtension, task_group: TaskGroup
    ) -> None:
        """20 MiB under memory_max 100M: two checks later, still the same run."""
        ext = make_extension(fast_config("hang.py", memory_max="100M"))
        first = await running(ext, task_group)
        await ext.call_tool("alloc", {"mb": 20})
        with anyio.move_on_after(2.5):  # two checks; an exceeded limit would end the run
            await ext.wait_for(lambda s: s.state is not State.RUNNING)
        assert (ext.snapshot().state, ext.snapshot().pid, ext.snapshot().memory_exceeded) == (
            State.RUNNING,
            first.pid,
            0,
        )
        await ext.stop()


class TestMemoryMaxWithACgroup:
    """The cgroup branch: the kernel enforces ``memory.max``; the daemon writes the limit and reads
    ``memory.events``. This machine delegates no memory controller (cgroup v1 memory), so a
    directory with the cgroup's files stands in for one; the kernel's side is not exercised."""

    async def test_the_limit_is_written_and_an_oom_kill_is_reported(self, tmp_path: Path) -> None:
        (tmp_path / "memory.max").write_text("max\n")
        (tmp_path / "memory.oom.group").write_text("0\n")
        (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
        errors: list[str] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                functools.partial(
                    enforce_memory_max,
                    os.getpid(),
                    "no-marker",
                    tmp_path,
                    64 << 20,
                    errors.append,
                    interval=0.01,
                )
            )
            # memory.oom.group (the whole tree at once) is written after memory.max: wait for both
            written = (tmp_path / "memory.max", str(64 << 20)), (tmp_path / "memory.oom.group", "1")
            await eventually(lambda: all(path.read_text() == text for path, text in written))
            with anyio.move_on_after(0.1):  # several reads of memory.events: no kill yet, no error
                await eventually(lambda: bool(errors), within=1)
            assert errors == []  # and not the RSS check: this test process is far over 64 MiB
            (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n")
            await eventually(lambda: bool(errors))
        assert errors == ["memory_max 64 MiB exceeded: killed by the kernel's OOM killer"]

    def test_without_the_controller_it_says_so(self, tmp_path: Path) -> None:
        missing = tmp_path / "not-a-cgroup"  # writing memory.max fails, as in a cgroup without it
        assert cgroup_memory_limit(missing, 1 << 30) is False
