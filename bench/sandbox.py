"""What the sandbox costs: the launcher, a start, a call; confined against ``sandbox: false``.

* ``launcher``: the exec launcher alone (``python -I -S launch.py ... -- /bin/true``) against
  ``/bin/true`` and against the interpreter's bare start (``python -I -S -c pass``), per network
  mode (``none`` adds a network namespace) and per level an older host gets (Landlock ABI 4 and
  1, no user namespaces);
* ``start_quick`` and ``start_sdk``: an extension from ``start()`` to running (handshake and
  tools listed), then stopped; confined and unconfined interleaved, median of each and their
  ratio; ``quick.py`` (stdlib only, the fastest start there is) and ``echo.py`` (the MCP SDK,
  as most Python servers);
* ``call``: ``echo`` calls on a running confined and a running unconfined extension, interleaved
  in rounds; median and p90 per call, and the ratio of medians (it must stay about 1: once
  started, a confined server talks over the same pipes).

Usage: ``python bench/sandbox.py [--repeat 20] [--calls 2000]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from supervisor import logs
from supervisor.config.settings import ExtensionConfig
from supervisor.extension.state import State
from supervisor.extension.supervised import Extension
from supervisor.process import sandbox

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "tests" / "servers"
QUICK = str(SERVERS / "quick.py")
SYSTEM = ["-r", "/usr", "-r", "/bin", "-r", "/lib", "-r", "/lib64", "-r", "/etc"]


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median": round(statistics.median(ordered) * 1000, 2),
        "p90": round(ordered[int(len(ordered) * 0.9) - 1] * 1000, 2),
    }


def _timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - started


def launcher(repeat: int) -> dict[str, Any]:
    """The launcher's own start, interleaved with its floors."""
    with tempfile.TemporaryDirectory(prefix="mcps-bench-") as staging:
        launch = [sys.executable, "-I", "-S", str(sandbox.LAUNCHER), "-s", staging, *SYSTEM]
        ways = {
            "true": ["/bin/true"],
            "python_bare": [sys.executable, "-I", "-S", "-c", "pass"],
            "launcher_all": [*launch, "-n", "all", "--", "/bin/true"],
            "launcher_none": [*launch, "-n", "none", "--", "/bin/true"],
            # the levels an older host gets (tests/process/sandbox/test_levels.py)
            "launcher_abi4": [*launch, "-n", "all", "-a", "4", "--", "/bin/true"],
            "launcher_abi1": [*launch, "-n", "all", "-a", "1", "--", "/bin/true"],
            "launcher_no_namespaces": [*launch, "-n", "all", "-N", "--", "/bin/true"],
            "launcher_no_namespaces_abi4": [*launch, "-n", "all", "-N", "-a", "4", "--", "/bin/true"],
        }
        samples: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(repeat):
            for name, argv in ways.items():
                samples[name].append(_timed(argv))
    result = {name: _ms(values) for name, values in samples.items()}
    floor = statistics.median(samples["true"])
    result["launcher_ms_over_exec"] = round((statistics.median(samples["launcher_all"]) - floor) * 1000, 2)
    return result


def _config(confined: bool, script: str = QUICK) -> ExtensionConfig:
    return ExtensionConfig.model_validate(
        {"command": sys.executable, "args": [script], "stop_timeout": 1, "sandbox": confined}
    )


async def _start_once(confined: bool, tg: Any, script: str) -> float:
    config = _config(confined, script)
    ext = Extension("bench", config, environ=dict(os.environ), marker_prefix="bench-sandbox:")
    started = time.perf_counter()
    await ext.start(tg)
    snapshot = await ext.wait_for(lambda s: s.state in (State.RUNNING, State.FAILED))
    took = time.perf_counter() - started
    assert snapshot.state is State.RUNNING, snapshot
    await ext.stop()
    return took


async def starts(repeat: int, script: str) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"confined": [], "unconfined": []}
    async with anyio.create_task_group() as tg:
        await _start_once(True, tg, script)  # warm: the kernel probe, page cache
        for _ in range(repeat):
            for confined, name in ((True, "confined"), (False, "unconfined")):
                samples[name].append(await _start_once(confined, tg, script))
        tg.cancel_scope.cancel()
    ratio = statistics.median(samples["confined"]) / statistics.median(samples["unconfined"])
    return {**{name: _ms(values) for name, values in samples.items()}, "ratio": round(ratio, 3)}


async def calls(count: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"confined": [], "unconfined": []}
    async with anyio.create_task_group() as tg:
        exts = {
            name: Extension(
                name, _config(name == "confined"), environ=dict(os.environ), marker_prefix="bench-sb:"
            )
            for name in samples
        }
        for ext in exts.values():
            await ext.start(tg)
            await ext.wait_for(lambda s: s.state is State.RUNNING)
        for ext in exts.values():  # warm-up
            for _ in range(50):
                await ext.call_tool("echo", {"text": "x"})
        rounds = 10
        for _ in range(rounds):
            for name, ext in exts.items():
                for _ in range(count // rounds):
                    started = time.perf_counter()
                    await ext.call_tool("echo", {"text": "x"})
                    samples[name].append(time.perf_counter() - started)
        for ext in exts.values():
            await ext.stop()
        tg.cancel_scope.cancel()
    ratio = statistics.median(samples["confined"]) / statistics.median(samples["unconfined"])
    return {**{name: _ms(values) for name, values in samples.items()}, "ratio": round(ratio, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    logs.configure(level=logging.WARNING)  # a state line per start would bury the JSON
    result = {
        "launcher": launcher(args.repeat),
        "start_quick": anyio.run(starts, args.repeat, QUICK),
        "start_sdk": anyio.run(starts, max(3, args.repeat // 2), str(SERVERS / "echo.py")),
        "call": anyio.run(calls, args.calls),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
