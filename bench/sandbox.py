"""What the sandbox costs: the launcher, a start, a call; confined against ``sandbox: false``.

* ``launcher``: the exec launcher alone (``python -I -S launch.py ... -- /bin/true``) against
  ``/bin/true`` and against the interpreter's bare start (``python -I -S -c pass``), per network
  mode (``none`` adds a network namespace) and per level an older host gets (Landlock ABI 4 and
  1, no user namespaces);
* ``start_quick`` and ``start_sdk``: an extension from ``start()`` to running (handshake and
  tools listed), then stopped; confined and unconfined interleaved, median of each and their
  ratio; ``quick.py`` (stdlib only, the fastest start there is) and ``echo.py`` (the MCP SDK,
  as most Python servers);
* ``start_by_level``: ``quick.py`` started confined at each level a host may offer (Landlock at
  this kernel's ABI and capped at 6, 4 and 1; and, in a second run of this script under the
  seccomp filter that refuses user namespaces, without namespaces at this ABI and at 4),
  interleaved with unconfined starts in the same process; median of each and its ratio to
  unconfined;
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
from supervisor.config.settings import StdioConfig
from supervisor.extension.state import State
from supervisor.extension.supervised import Extension
from supervisor.process import sandbox

ROOT = Path(__file__).resolve().parent.parent
SERVERS = ROOT / "tests" / "servers"
QUICK = str(SERVERS / "quick.py")
# As the daemon gives them: real paths (the launcher binds what it opens without following a
# symlink), and the symlinks that lead there (/bin -> usr/bin) made again inside.
SYSTEM = [
    arg
    for path in ("/usr", "/bin", "/lib", "/lib64", "/etc")
    for arg in (["-r", os.path.realpath(path)] + (["-l", path] if os.path.islink(path) else []))
]


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


def _config(confined: bool, script: str = QUICK) -> StdioConfig:
    return StdioConfig.model_validate(
        {"command": sys.executable, "args": [script], "stop_timeout": 1, "sandbox": confined}
    )


async def _start_once(confined: bool, tg: Any, script: str, abi: int | None = None) -> float:
    config = _config(confined, script)
    context = sandbox.Context(dict(os.environ), max_abi=abi)
    ext = Extension(
        "bench", config, environ=dict(os.environ), marker_prefix="bench-sandbox:", sandbox_context=context
    )
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


ABIS = {"kernel": None, "abi 6": 6, "abi 4": 4, "abi 1": 1}


async def starts_by_level(repeat: int, abis: dict[str, int | None]) -> dict[str, Any]:
    """quick.py started at each of *abis* and unconfined, interleaved; medians and ratios."""
    samples: dict[str, list[float]] = {name: [] for name in (*abis, "unconfined")}
    async with anyio.create_task_group() as tg:
        for abi in abis.values():
            await _start_once(True, tg, QUICK, abi)  # warm: each cap's kernel probe
        for _ in range(repeat):
            for name, abi in abis.items():
                samples[name].append(await _start_once(True, tg, QUICK, abi))
            samples["unconfined"].append(await _start_once(False, tg, QUICK))
        tg.cancel_scope.cancel()
    floor = statistics.median(samples["unconfined"])
    return {
        name: {**_ms(values), "ratio": round(statistics.median(values) / floor, 3)}
        for name, values in samples.items()
    }


def _without_user_namespaces(repeat: int) -> dict[str, Any]:
    """This script again, under the seccomp filter that refuses user namespaces."""
    seccomp = Path(sandbox.__file__).with_name("seccomp.py")
    argv = [sys.executable, "-I", "-S", str(seccomp), "--only-user-namespaces", "--"]
    argv += [sys.executable, __file__, "--levels-only", "--repeat", str(repeat)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT)
    found: dict[str, Any] = json.loads(done.stdout)
    return {f"no user namespaces, {name}": figures for name, figures in found.items()}


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
    parser.add_argument("--levels-only", action="store_true", help="only start_by_level (kernel, abi 4)")
    args = parser.parse_args()
    logs.configure(level=logging.WARNING)  # a state line per start would bury the JSON
    if args.levels_only:
        abis = {name: ABIS[name] for name in ("kernel", "abi 4")}
        print(json.dumps(anyio.run(starts_by_level, args.repeat, abis)))
        return
    by_level = anyio.run(starts_by_level, args.repeat, ABIS)
    by_level |= _without_user_namespaces(args.repeat)
    result = {
        "launcher": launcher(args.repeat),
        "start_quick": anyio.run(starts, args.repeat, QUICK),
        "start_sdk": anyio.run(starts, max(3, args.repeat // 2), str(SERVERS / "echo.py")),
        "start_by_level": by_level,
        "call": anyio.run(calls, args.calls),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
