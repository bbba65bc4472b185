"""Prometheus metrics: call counters and latency observed as calls happen, the rest read at scrape time.

Each daemon has a registry of its own (no global state). Label sets are bounded: the tool
label takes only the tools an extension lists (others count as ``(unknown)``), and an
extension removed by a reload takes its series with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.daemon.recent import Recent
from supervisor.extension.state import State

__all__ = ("Metrics",)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, float("inf"))


class Metrics:
    """The daemon's metrics. *health* returns the ``health`` report (see Daemon.health)."""

    def __init__(self, health: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()  # no auto_describe: the health collector reads live state
        self.recent = Recent()  # the last minutes, for the dashboard's chart
        labels = ["extension", "tool"]
        self._calls = Counter("mcp_supervisor_tool_calls", "Tool calls.", labels, registry=self.registry)
        self._errors = Counter(
            "mcp_supervisor_tool_call_errors", "Tool calls without a result, or with isError.", labels,
            registry=self.registry,
        )  # fmt: skip
        self._latency = Histogram(
            "mcp_supervisor_tool_call_duration_seconds", "Tool call latency, waiting for a restart included.",
            ["extension"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        # The label children of each (extension, tool) called: labels() costs a lookup under a
        # lock per call; forget() drops them with their series.
        self._series: dict[tuple[str, str], tuple[Any, Any]] = {}
        self.registry.register(_HealthCollector(health))

    def observe_call(self, extension: str, tool: str, seconds: float, succeeded: bool) -> None:
        series = self._series.get((extension, tool))
        if series is None:
            series = self._calls.labels(extension, tool), self._latency.labels(extension)
            self._series[extension, tool] = series
        calls, latency = series
        calls.inc()
        if not succeeded:
            self._errors.labels(extension, tool).inc()
        latency.observe(seconds)
        self.recent.observe(extension, seconds, succeeded)

    def forget(self, extension: str) -> None:
        """Drop the series of an extension that no longer exists."""
        for ext, tool in [key for key in self._series if key[0] == extension]:
            del self._series[ext, tool]
            for counter in (self._calls, self._errors):
                with contextlib.suppress(KeyError):  # never observed with this label set
                    counter.remove(extension, tool)
        with contextlib.suppress(KeyError):
            self._latency.remove(extension)
        self.recent.forget(extension)

    def render(self) -> str:
        """The Prometheus text exposition format."""
        return generate_latest(self.registry).decode()


class _HealthCollector(Collector):
    def __init__(self, health: Callable[[], dict[str, Any]]) -> None:
        self._health = health

    def collect(self) -> Iterator[Metric]:
        report = self._health()
        state = GaugeMetricFamily(
            "mcp_supervisor_extension_state",
            "1 for the state each extension is in.",
            labels=["extension", "state"],
        )
        restarts = CounterMetricFamily(
            "mcp_supervisor_extension_restarts", "Automatic restarts.", labels=["extension"]
        )
        in_flight = GaugeMetricFamily(
            "mcp_supervisor_extension_calls_in_flight", "Tool calls in progress.", labels=["extension"]
        )
        tree, instances = _TreeFamilies(), _InstanceFamilies()
        for ext in report["extensions"]:
            tree.add(ext)
            instances.add(ext)
            for candidate in State:
                state.add_metric(
                    [ext["name"], candidate.value], 1.0 if ext["state"] == candidate.value else 0.0
                )
            restarts.add_metric([ext["name"]], ext["restarts"])
            in_flight.add_metric([ext["name"]], ext["in_flight"])
        yield from (state, restarts, in_flight, *tree.families, *instances.families)
        spool = report["spool"]
        yield GaugeMetricFamily(
            "mcp_supervisor_spool_bytes", "Bytes in the media spool.", value=spool["bytes"]
        )
        yield GaugeMetricFamily(
            "mcp_supervisor_spool_files", "Files in the media spool.", value=spool["files"]
        )
        process = report["process"]
        for key, help_text in (
            ("rss_bytes", "Resident memory of the daemon."),
            ("threads", "Threads of the daemon."),
            ("worker_threads", "Threads of the daemon's pool for blocking calls (of its threads)."),
            ("blocking_calls", "Blocking calls running in that pool now."),
            ("open_fds", "Open file descriptors of the daemon."),
            ("asyncio_tasks", "asyncio tasks of the daemon."),
            ("uptime_s", "Seconds since the daemon started."),
        ):
            yield GaugeMetricFamily(f"mcp_supervisor_process_{key}", help_text, value=process[key])


class _TreeFamilies:
    """Per extension: its process tree (read once per scrape, :mod:`supervisor.process.usage`) and guards."""

    def __init__(self) -> None:
        def gauge(name: str, help_text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"mcp_supervisor_extension_{name}", help_text, labels=["extension"])

        def counter(name: str, help_text: str) -> CounterMetricFamily:
            return CounterMetricFamily(f"mcp_supervisor_extension_{name}", help_text, labels=["extension"])

        self.rss = gauge("rss_bytes", "Resident memory of the extension's whole process tree (sum).")
        self.cpu = counter("cpu_seconds", "CPU seconds of the tree: live processes and reaped children.")
        self.processes = gauge("processes", "Processes in the extension's tree.")
        self.unresponsive = counter("unresponsive", "Runs restarted for not answering pings (liveness).")
        self.memory = counter("memory_exceeded", "Runs restarted for exceeding memory_max.")
        self.families = (self.rss, self.cpu, self.processes, self.unresponsive, self.memory)

    def add(self, ext: dict[str, Any]) -> None:
        usage, labels = ext["resources"], [ext["name"]]
        self.rss.add_metric(labels, usage["rss_bytes"])
        self.cpu.add_metric(labels, usage["cpu_seconds"])
        self.processes.add_metric(labels, usage["processes"])
        self.unresponsive.add_metric(labels, ext["unresponsive"])
        self.memory.add_metric(labels, ext["memory_exceeded"])


class _InstanceFamilies:
    """Per per-client extension: its instances, summed. The series above are its shared instance's.

    Summed, not labelled per instance: an instance lives as long as one client connection, so a
    label for it would start new series with every connection (and ``instance`` is the label
    Prometheus gives each scrape target). The restart counter includes the instances that are
    gone, so it never goes down.
    """

    def __init__(self) -> None:
        def family(kind: type[Metric], name: str, help_text: str) -> Any:
            return kind(f"mcp_supervisor_extension_instance{name}", help_text, labels=["extension"])

        self.count = family(GaugeMetricFamily, "s", "Per-client instances whose child may exist.")
        self.max = family(GaugeMetricFamily, "s_max", "Per-client instances allowed (max_instances).")
        self.in_flight = family(
            GaugeMetricFamily, "_calls_in_flight", "Tool calls in progress, all instances."
        )
        self.restarts = family(
            CounterMetricFamily,
            "_restarts",
            "Automatic restarts of per-client instances, ended ones included.",
        )
        self.rss = family(GaugeMetricFamily, "_rss_bytes", "Resident memory of all instances' trees (sum).")
        self.processes = family(GaugeMetricFamily, "_processes", "Processes in all instances' trees.")
        self.families = (self.count, self.max, self.in_flight, self.restarts, self.rss, self.processes)

    def add(self, ext: dict[str, Any]) -> None:
        instances = ext.get("instances")
        if instances is None:  # a shared extension
            return
        labels, each = [ext["name"]], instances["each"]
        self.count.add_metric(labels, instances["count"])
        self.max.add_metric(labels, instances["max"])
        self.in_flight.add_metric(labels, sum(i["in_flight"] for i in each))
        self.restarts.add_metric(labels, instances["totals"]["restarts"])
        self.rss.add_metric(labels, sum(i["resources"]["rss_bytes"] for i in each))
        self.processes.add_metric(labels, sum(i["resources"]["processes"] for i in each))
