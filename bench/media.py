"""A large image result through the daemon, against the MCP SDK's own stdio client.

For each payload size (decoded image bytes), one call of ``image(bytes=N)`` on the media
fixture (tests/servers/media.py), after a warm-up call of 300,000 bytes (above the spool's
default inline limit, so a spooling daemon warms that path too):

* ``sdk`` (the baseline): a fresh Python subprocess runs the SDK's ``stdio_client`` and
  ``ClientSession`` against the fixture. Measured there: the call's wall time and the
  process's peak RSS increase during it (``VmHWM`` after minus ``VmRSS`` before, from
  ``/proc/self/status``).
* ``daemon``: a fresh daemon (``python -m supervisor daemon``, temp dir under /tmp holding
  config, socket and spool) runs the fixture as extension ``media``; the call goes through the
  control socket (``supervisor.control.client.request``). Measured: the request's wall time (the reply
  parsed), the DAEMON's peak RSS increase (``/proc/<pid>/status``), the content types that came
  back and the reply line's size.

Each repeat uses a fresh process for both, so VmHWM means this call's peak. Reported per size:
the median wall time, the max peak RSS increase, ``rss_ratio`` = peak increase / payload and
``speedup`` = sdk wall / daemon wall. ``verified`` says whether what came back has the right
size: the base64 length of an inline image, or the size of a ``file://`` resource_link's file.

``--tool items`` runs the screenshot fixture (tests/servers/screenshot.py) instead, whose
``items(bytes=N)`` returns the image both as content and nested in ``structuredContent``
(with an outputSchema): there ``reply_bytes`` shows whether the structured copy was spooled.

Usage: ``python bench/media.py [--sizes 5,20] [--repeat 3] [--tool image|items]`` (sizes in
MiB); prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import anyio

from supervisor.control import client

ROOT = Path(__file__).resolve().parent.parent
SERVERS = {
    "image": ROOT / "tests" / "servers" / "media.py",
    "items": ROOT / "tests" / "servers" / "screenshot.py",
}
MIB = 1 << 20
WARMUP_BYTES = 300_000
CALL_TIMEOUT = 120.0
START_TIMEOUT = 30.0


def memory(pid: int | str = "self") -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of *pid*, in MiB."""
    found: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024  # kB
    return found


def peak_increase(before: dict[str, float], after: dict[str, float]) -> float:
    return after["VmHWM"] - before["VmRSS"]


def inspect(content: list[dict[str, Any]], size: int) -> tuple[list[str], bool | None]:
    """The content types, and whether the image came back whole (None: no way to tell)."""
    returned = [str(block.get("type")) for block in content]
    for block in content:
        if block.get("type") == "image":
            return returned, len(block.get("data") or "") == 4 * -(-size // 3)
        if block.get("type") == "resource_link":
            uri = urlparse(str(block.get("uri")))
            if uri.scheme != "file":
                return returned, None
            path = Path(unquote(uri.path))
            return returned, path.is_file() and path.stat().st_size == size
    return returned, False


# --- (a) the baseline: the SDK's stdio client, in a fresh process (see sdk_child) ---------------


async def sdk_child(size: int, tool: str) -> dict[str, Any]:
    """Runs in the subprocess: one warm-up call, then the measured one."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=[str(SERVERS[tool])], env=dict(os.environ))
    # The fixture's stderr is ours, which run_sdk captures for its error message.
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        with anyio.fail_after(START_TIMEOUT):
            await session.initialize()
            await session.call_tool(tool, {"bytes": WARMUP_BYTES})
        before = memory()
        started = time.perf_counter()
        with anyio.fail_after(CALL_TIMEOUT):
            result = await session.call_tool(tool, {"bytes": size})
        wall = time.perf_counter() - started
        after = memory()
        content = [block.model_dump(by_alias=True, exclude_none=True) for block in result.content]
        returned, verified = inspect(content, size)
    reply_bytes = (
        len(result.model_dump_json(by_alias=True, exclude_none=True)) + 1
    )  # as sent on the wire, about
    return {
        "wall_s": wall,
        "before": before,
        "after": after,
        "returned": returned,
        "verified": verified,
        "reply_bytes": reply_bytes,
    }


def run_sdk(size: int, tool: str) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--sdk-child", str(size), "--tool", tool]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CALL_TIMEOUT + 60)
    if done.returncode != 0:
        raise RuntimeError(f"the SDK subprocess failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- (b) through the daemon ----------------------------------------------------------------------


def write_config(directory: Path, tool: str) -> Path:
    config = {
        "socket": str(directory / "control.sock"),
        "spool": {"dir": str(directory / "spool")},
        "extensions": {
            "media": {
                "command": sys.executable,
                "args": [str(SERVERS[tool])],
                "call_timeout": CALL_TIMEOUT,
                "stop_timeout": 1,
            }
        },
    }
    path = directory / "bench.json"
    path.write_text(json.dumps(config))
    return path


def start_daemon(directory: Path, tool: str) -> subprocess.Popen[bytes]:
    """The daemon on *directory*'s config; its stderr goes to daemon.log there."""
    command = [sys.executable, "-m", "supervisor", "daemon", "-c", str(write_config(directory, tool))]
    with (directory / "daemon.log").open("wb") as stderr:
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)


def stop_daemon(daemon: subprocess.Popen[bytes]) -> None:
    daemon.send_signal(signal.SIGTERM)
    try:
        daemon.wait(timeout=30)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


def log_tail(directory: Path) -> str:
    return (directory / "daemon.log").read_text(errors="replace").strip()[-2000:]


async def wait_running(sock: str, daemon: subprocess.Popen[bytes], directory: Path) -> None:
    with anyio.fail_after(START_TIMEOUT):
        while daemon.poll() is None:
            try:
                (record,) = (await client.request(sock, "status", {"name": "media"}))["extensions"]
            except client.DaemonUnreachable:
                record = {}
            if record.get("state") == "running":
                return
            if record.get("state") == "failed":
                raise RuntimeError(f"extension media failed: {record.get('last_error')}")
            await anyio.sleep(0.05)
    raise RuntimeError(f"the daemon exited with {daemon.returncode}: {log_tail(directory)}")


async def run_daemon(size: int, tool: str) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="mcps-media-", dir="/tmp"))
    sock = str(directory / "control.sock")
    try:
        daemon = start_daemon(directory, tool)
        try:
            await wait_running(sock, daemon, directory)
            call = {"name": "media", "tool": tool, "arguments": {"bytes": WARMUP_BYTES}}
            await client.request(sock, "call", call, timeout=CALL_TIMEOUT)
            call["arguments"] = {"bytes": size}
            before = memory(daemon.pid)
            started = time.perf_counter()
            result = await client.request(sock, "call", call, timeout=CALL_TIMEOUT)
            wall = time.perf_counter() - started
            after = memory(daemon.pid)
            returned, verified = inspect(result.get("content") or [], size)  # before the spool goes
        finally:
            stop_daemon(daemon)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    reply = {"jsonrpc": "2.0", "id": 1, "result": result}  # the daemon's own framing: compact, ASCII
    reply_bytes = len(json.dumps(reply, separators=(",", ":")).encode()) + 1
    return {
        "wall_s": wall,
        "before": before,
        "after": after,
        "returned": returned,
        "verified": verified,
        "reply_bytes": reply_bytes,
    }


# --- the report ----------------------------------------------------------------------------------


def summarize(samples: list[dict[str, Any]], mib: float) -> dict[str, Any]:
    walls = [s["wall_s"] for s in samples]
    peak = max(peak_increase(s["before"], s["after"]) for s in samples)
    summary: dict[str, Any] = {
        "wall_s": round(statistics.median(walls), 3),
        "wall_s_runs": [round(w, 3) for w in walls],
        "peak_rss_increase_mib": round(peak, 1),
        "rss_ratio": round(peak / mib, 2),
        "peak_rss_increase_mib_runs": [round(peak_increase(s["before"], s["after"]), 1) for s in samples],
        "rss_before_mib": round(max(s["before"]["VmRSS"] for s in samples), 1),
        "returned": samples[-1]["returned"],
        "verified": all(s["verified"] for s in samples) if all(s["verified"] is not None for s in samples)
        else None,
    }  # fmt: skip
    if "reply_bytes" in samples[-1]:
        summary["reply_bytes"] = max(s["reply_bytes"] for s in samples)
    return summary


async def main(sizes_mib: list[float], repeat: int, tool: str) -> dict[str, Any]:
    results = []
    for mib in sizes_mib:
        size = round(mib * MIB)
        sdk, daemon = [], []
        for _ in range(repeat):
            sdk.append(await anyio.to_thread.run_sync(run_sdk, size, tool))
            daemon.append(await run_daemon(size, tool))
        entry: dict[str, Any] = {"mib": mib, "sdk": summarize(sdk, mib), "daemon": summarize(daemon, mib)}
        entry["speedup"] = round(entry["sdk"]["wall_s"] / max(entry["daemon"]["wall_s"], 1e-9), 1)
        results.append(entry)
    return {
        "tool": tool,
        "sizes_mib": sizes_mib,
        "repeat": repeat,
        "warmup_bytes": WARMUP_BYTES,
        "results": results,
    }


def parse_sizes(text: str) -> list[float]:
    sizes = [float(part) for part in text.split(",") if part.strip()]
    return [int(size) if size.is_integer() else size for size in sizes]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=parse_sizes, default=[5, 20], help="payload sizes in MiB (5,20)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tool", choices=sorted(SERVERS), default="image", help="image (media.py) or items")
    parser.add_argument("--sdk-child", type=int, metavar="BYTES", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sdk_child is not None:
        print(json.dumps(anyio.run(sdk_child, args.sdk_child, args.tool)))
    else:
        print(json.dumps(anyio.run(main, args.sizes, max(1, args.repeat), args.tool), indent=2))
