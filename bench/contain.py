"""What containment costs, and how fast a dead daemon's trees die.

* ``guardian``: start time (spawn to its ``ready`` line) and memory (RSS, PSS) of the
  guardian process each daemon runs, against the daemon's own RSS in the same run;
* ``spawn``: mean time from spawning a trivial child to noticing its exit, with and without
  a cgroup (the exec shim: setpriv, sh, cgroup join), against a bare ``Popen`` + ``wait``;
  and the mean teardown of a tree of three (``tree.py --mode group``), per containment;
* ``sigkill``: a daemon with one extension of each tree shape of ``tests/servers/tree.py``
  is SIGKILLed; time until no process of any tree is alive, per containment (without the
  ``scrub`` shape under ``scan``: the known gap, reported as ``left``).

Usage: ``python bench/contain.py [--repeat 5]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

from supervisor.control import client
from supervisor.process import cgroups, guardian
from supervisor.process import children as process
from supervisor.process.cgroups import Subtree

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "tests" / "servers"
SHAPES = ("child", "group", "double", "forkloop", "clearenv", "scrub")


def _memory(pid: int) -> dict[str, float]:
    rss = pss = 0
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    return {"rss_mib": round(rss / 1024, 1), "pss_mib": round(pss / 1024, 1)}


def _scrub_left(tag: str) -> None:
    """Kill what the known gap left (the scan fallback's scrub shape after a SIGKILL)."""
    for entry in os.scandir("/proc"):
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as cmdline:
                if entry.name.isdigit() and tag.encode() in cmdline.read():
                    os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue


def guardian_cost(repeat: int) -> dict[str, Any]:
    """Start guardians for this process (as a daemon would) and measure them."""
    starts, memory = [], []
    for _ in range(repeat):
        read_end, write_end = os.pipe()
        started = time.perf_counter()
        argv = guardian.argv(daemon=os.getpid(), prefix=f"bench-{uuid.uuid4().hex}:", subtree=None)
        proc = subprocess.Popen(argv, stdin=read_end, stdout=subprocess.PIPE, start_new_session=True)
        os.close(read_end)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        starts.append((time.perf_counter() - started) * 1000)
        memory.append(_memory(proc.pid))
        os.close(write_end)  # a clean exit: it makes its pass and leaves
        proc.wait(10)
    return {
        "start_ms": {"median": round(statistics.median(starts), 1), "max": round(max(starts), 1)},
        "rss_mib": statistics.median(m["rss_mib"] for m in memory),
        "pss_mib": statistics.median(m["pss_mib"] for m in memory),
    }


async def spawn_cost(repeat: int) -> dict[str, float]:
    """Mean ms per spawn-to-exit of a trivial child, and per teardown of a small tree."""
    argv = ["/bin/sh", "-c", "exit 0"]
    tree = [sys.executable, str(SERVERS / "tree.py"), "--mode", "group"]

    def bare() -> float:
        started = time.perf_counter()
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE).wait()
        return time.perf_counter() - started

    async def spawned() -> float:
        started = time.perf_counter()
        child = await process.spawn(argv, env=dict(os.environ), cwd=None, marker="bench-spawn:")
        await child.exited.wait()
        took = time.perf_counter() - started
        await process.terminate_tree(child, grace=0)
        return took

    async def torn_down() -> float:
        child = await process.spawn(tree, env=dict(os.environ), cwd=None, marker="bench-spawn:")
        while b"tree: ready" not in await child.stderr.read():
            pass
        started = time.perf_counter()
        await process.terminate_tree(child, grace=0)
        return time.perf_counter() - started

    async def mean(fn: Any, times: int) -> float:
        samples = [await fn() for _ in range(times)]
        return round(statistics.mean(samples) * 1000, 2)

    result = {
        "popen_wait_ms": round(statistics.mean(bare() for _ in range(repeat)) * 1000, 2),
        "spawn_exit_ms": await mean(spawned, repeat),
        "teardown_scan_ms": await mean(torn_down, 5),
    }
    located = cgroups.locate()
    if located is not None:
        subtree = Subtree.prepare(located[0], f"bench-{uuid.uuid4().hex[:8]}", move_self=False)
        process.contain_in(subtree)
        try:
            result["spawn_exit_cgroup_ms"] = await mean(spawned, repeat)
            result["teardown_cgroup_ms"] = await mean(torn_down, 5)
        finally:
            process.contain_in(None)
            subtree.remove_all()
    return result


def _tagged(*tags: str) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                if stat.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as cmdline:
                argv = cmdline.read()
                count += any(tag.encode() in argv for tag in tags)
        except OSError:
            continue
    return count


def _start_daemon(directory: str, tag: str, containment: str) -> subprocess.Popen[bytes]:
    extensions = {
        shape: {
            "command": sys.executable,
            "args": [str(SERVERS / "tree.py"), "--mode", shape, "--tag", f"{tag}-{shape}"],
            "backoff": {"initial": 0, "jitter": 0},
        }
        for shape in SHAPES
    }
    config = Path(directory, "config.json")
    config.write_text(json.dumps({"socket": f"{directory}/control.sock", "extensions": extensions}))
    env = {**os.environ, "MCP_SUPERVISOR_CONTAINMENT": containment}
    return subprocess.Popen(
        [sys.executable, "-m", "supervisor", "daemon", "-c", str(config)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip


def _kill_and_wait(daemon: subprocess.Popen[bytes], tags: list[str]) -> tuple[float, int]:
    """SIGKILL *daemon*; (ms until no process with one of *tags* is alive, how many are left after 10 s)."""
    killed = time.perf_counter()
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()
    while _tagged(*tags) and time.perf_counter() - killed < 10:
        time.sleep(0.005)  # other processes: polling with a deadline
    return (time.perf_counter() - killed) * 1000, _tagged(*tags)


async def sigkill_cleanup(containment: str) -> dict[str, Any]:
    """SIGKILL a daemon with every tree shape; ms until none of their processes is alive."""
    tag = f"bench-{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory(prefix="mcpb-", dir="/tmp") as directory:
        sock = f"{directory}/control.sock"
        daemon = _start_daemon(directory, tag, containment)
        try:
            with anyio.fail_after(60):
                while True:
                    try:
                        records = (await client.request(sock, "status"))["extensions"]
                    except client.DaemonUnreachable:
                        records = []
                    if records and all(r["state"] == "running" for r in records):
                        break
                    await anyio.sleep(0.05)
            health = await client.request(sock, "health")
            processes = _tagged(tag)
            shapes = [s for s in SHAPES if not (containment == "scan" and s == "scrub")]
            took, _ = await anyio.to_thread.run_sync(_kill_and_wait, daemon, [f"{tag}-{s}" for s in shapes])
            left = _tagged(tag)
        finally:
            if daemon.poll() is None:
                daemon.kill()
            _scrub_left(tag)
        return {
            "mode": health["containment"]["mode"],
            "daemon_rss_mib": round(health["process"]["rss_bytes"] / 2**20, 1),
            "processes": processes,
            "all_dead_ms": round(took, 1),
            "left": left,
        }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    report = {
        "guardian": guardian_cost(args.repeat),
        "spawn": await spawn_cost(args.repeat * 10),
        "sigkill": {mode: await sigkill_cleanup(mode) for mode in ("cgroup", "scan")},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    anyio.run(main)
