"""How the CLI shows what the daemon returns: tables, sizes, durations, tool results.

Pure functions from the control protocol's JSON to text; nothing here talks to the daemon.
"""

from __future__ import annotations

import json
import urllib.parse
from datetime import UTC, datetime
from typing import Any

__all__ = (
    "changes_text",
    "duration",
    "exit_text",
    "health_text",
    "profiles_table",
    "result_text",
    "sandbox_text",
    "size",
    "status_table",
    "table",
    "tools_table",
)


def duration(seconds: float) -> str:
    """A short human duration: ``42s``, ``3m 12s``, ``5h 2m``, ``2d 4h``."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def size(count: int) -> str:
    """A human byte count: ``512 B``, ``4.2 KiB``, ``5.0 MiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _when(text: str | None) -> datetime | None:
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def exit_text(last_exit: dict[str, Any] | None) -> str | None:
    if not last_exit:
        return None
    if last_exit.get("signal"):
        return f"killed by {last_exit['signal']}"
    return f"exited with code {last_exit.get('code')}"


def _detail(record: dict[str, Any], now: datetime) -> str:
    """The most useful fact about one extension in its current state."""
    notes = [_state_detail(record, now)]
    if (remote := record.get("remote")) and record["state"] == "running":
        rtt = f", {remote['rtt_ms']:g} ms" if remote.get("rtt_ms") is not None else ""
        notes.insert(0, f"{remote['url']} ({remote.get('transport')}{rtt}{_login_note(remote, now)})")
    count = len(record.get("instances") or ())
    if count:
        notes.append(f"{count} per-client instance{'s' if count != 1 else ''}")
    if changed := record.get("tools_changed"):
        held = sum(1 for change in changed if change.get("held"))
        text = f"{len(changed)} tool{'s' if len(changed) != 1 else ''} changed since pinned"
        notes.append(f"{text}{f' ({held} held)' if held else ''}: mcp-supervisor approve {record['name']}")
    return "; ".join(note for note in notes if note)


def _login_note(remote: dict[str, Any], now: datetime) -> str:
    """ ", logged in for 59m" (the access token's life left; it is refreshed before it ends)."""
    login = remote.get("login")
    if not login or not login.get("logged_in"):
        return ""
    expires = login.get("expires_at")
    if expires is None:
        return ", logged in"
    left = max(0.0, expires - now.timestamp())
    return f", logged in, token {duration(left)} left{', refreshable' if login.get('refreshable') else ''}"


def _state_detail(record: dict[str, Any], now: datetime) -> str:
    state = record["state"]
    reason = record.get("last_error") or exit_text(record.get("last_exit"))
    if state == "running":
        calls = record.get("in_flight") or 0
        renamed = len(record.get("name_collisions") or ())
        notes = [f"{calls} call{'s' if calls != 1 else ''} in flight"] if calls else []
        if tree := record.get("resources"):  # the whole process tree
            notes.append(
                f"{tree['processes']} proc, RSS {size(tree['rss_bytes'])}, CPU {tree['cpu_seconds']:.1f}s"
            )
        notes += (
            [f"{renamed} tool{'s' if renamed != 1 else ''} renamed by a name collision"] if renamed else []
        )
        return "; ".join(notes)
    if state == "backoff":
        at = _when(record.get("next_restart"))
        wait = f"restart in {max(0.0, (at - now).total_seconds()):.1f}s" if at else "restart pending"
        text = f"{wait} (attempt {record.get('failures') or 1})"
        return f"{text}; {reason}" if reason else text
    if state == "starting":
        since = _when(record.get("since"))
        elapsed = f" {duration((now - since).total_seconds())}" if since else ""
        if record.get("queued"):  # waiting for a start slot: no process yet
            return f"queued{elapsed} for a start slot (place {record['queued']})"
        waiting = record.get("waiting")
        text = f"waiting{elapsed} for {waiting}" if waiting else f"spawning{elapsed}"
        if record.get("detail"):  # slow start: past its deadline, still busy
            text = f"{text}; {record['detail']}"
        last = record.get("last_stderr")  # a wrapper's download progress, say; made safe by the daemon
        return f"{text}; stderr: {last}" if last else text
    if state == "needs-login":
        return f"run `mcp-supervisor login {record['name']}`"
    if state in ("failed", "stopped"):
        if record.get("detail"):  # "on demand": idle, not broken; the next call starts it
            return str(record["detail"])
        return reason or ""
    return ""


def table(rows: list[tuple[str, ...]]) -> str:
    """Left-aligned columns two spaces apart; the last column is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]) for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def status_table(
    records: list[dict[str, Any]], now: datetime | None = None, *, instances: bool = False
) -> str:
    """One row per extension; *instances*: then one per per-client instance, under its extension."""
    now = now or datetime.now(UTC)
    rows = [("NAME", "STATE", "PID", "UPTIME", "RESTARTS", "TOOLS", "DETAIL")]
    for record in records:
        rows.append(
            (record["name"], *_status_cells(record, now), str(record.get("tools", 0)), _detail(record, now))
        )
        for n, instance in enumerate(record.get("instances") or () if instances else (), 1):
            name = f"  {record['name']}[{n}]"
            rows.append((name, *_status_cells(instance, now), "-", _state_detail(instance, now)))
    return table(rows)


def _status_cells(record: dict[str, Any], now: datetime) -> tuple[str, str, str, str]:
    since = _when(record.get("since"))
    uptime = duration((now - since).total_seconds()) if since and record["state"] == "running" else "-"
    pid = record.get("pid")
    shown = str(pid) if pid else "remote" if record.get("remote") else "-"
    return record["state"], shown, uptime, str(record.get("restarts", 0))


def profiles_table(profiles: list[dict[str, Any]]) -> str | None:
    """Client views and their tool counts; None when there is nothing to say (no profile, within budget)."""
    if not profiles or (len(profiles) == 1 and not profiles[0].get("over_budget")):
        return None
    rows = [("PROFILE", "MODE", "TOOLS", "LISTED", "MAX", "DETAIL")]
    for p in profiles:
        over = p["listed"] - p["max_tools"]
        detail = f"over budget: a client that takes {p['max_tools']} drops {over}" if over > 0 else ""
        name = p["name"] if p["name"] is not None else "(default)"
        rows.append((name, p["mode"], str(p["tools"]), str(p["listed"]), str(p["max_tools"]), detail))
    return table(rows)


def tools_table(tools: list[dict[str, Any]], width: int) -> str:
    """Extension, tool, the name gateway clients see (``-`` if filtered out) and the description."""
    rows = [("EXTENSION", "TOOL", "GATEWAY NAME", "DESCRIPTION")]
    for t in tools:
        exposed = t.get("exposed") or "-"
        if t.get("collision"):
            exposed += " (renamed: collision)"
        if changed := t.get("changed"):
            exposed += " (held: changed)" if changed.get("held") else " (changed)"
        rows.append((t["extension"], t["name"], exposed, (t.get("description") or "").strip().split("\n")[0]))
    used = sum(max(len(row[i]) for row in rows) + 2 for i in range(3))
    room = max(width - used, 20)
    return table([(*row[:3], row[3] if len(row[3]) <= room else row[3][: room - 1] + "…") for row in rows])


def changes_text(tools: list[dict[str, Any]]) -> str | None:
    """The tools whose definition changed since pinned, one line each; None when there is none."""
    changed = [t for t in tools if t.get("changed")]
    if not changed:
        return None
    lines = ["changed since pinned (accept with `mcp-supervisor approve EXTENSION [TOOL]`):"]
    for t in changed:
        change = t["changed"]
        held = "; held: hidden from gateway clients" if change.get("held") else ""
        lines.append(f"  {t['extension']}/{t['name']}: {', '.join(change.get('parts') or [])}{held}")
    return "\n".join(lines)


def _content_line(item: dict[str, Any]) -> str:
    """One line standing for a non-text content item."""
    kind = item.get("type", "?")
    if kind in ("image", "audio"):
        return f"[{kind} {item.get('mimeType', '?')}, {len(item.get('data', ''))} bytes base64]"
    spooled_from = (item.get("_meta") or {}).get("originalType") if kind == "resource_link" else None
    if spooled_from and str(item.get("uri", "")).startswith("file://"):  # written by our media spool
        shown = size(item["size"]) if isinstance(item.get("size"), int) else "? B"
        path = urllib.parse.unquote(str(item["uri"]).removeprefix("file://"))
        return f"{path}  [{item.get('mimeType', '?')}, {shown}, spooled {spooled_from}]"
    if kind == "resource_link":
        shown = size(item["size"]) if isinstance(item.get("size"), int) else None
        return "[" + " ".join(str(p) for p in (kind, item.get("uri"), item.get("mimeType"), shown) if p) + "]"
    if kind == "resource":
        resource = item.get("resource") or {}
        head = " ".join(str(p) for p in (kind, resource.get("uri"), resource.get("mimeType")) if p)
        if "text" in resource:
            return f"[{head}, {len(resource['text'])} characters]"
        return f"[{head}, {len(resource.get('blob', ''))} bytes base64]"
    return f"[{kind}]"


def result_text(result: dict[str, Any]) -> str:
    """A tool result for people: text as is, other content one line each, else structured JSON."""
    parts: list[str] = []
    has_text = False
    for item in result.get("content") or []:
        if item.get("type") == "text":
            has_text = True
            parts.append(item.get("text", "").removesuffix("\n"))
        else:
            parts.append(_content_line(item))
    if result.get("structuredContent") is not None and not has_text:
        parts.append(json.dumps(result["structuredContent"], indent=2))
    return "\n".join(parts)


def health_text(report: dict[str, Any]) -> str:
    """The `health` report as a two-line summary and a table."""
    proc, spool = report["process"], report["spool"]
    lines = [
        f"daemon  pid {proc['pid']}, up {duration(proc['uptime_s'])}, RSS {size(proc['rss_bytes'])}, "
        f"{proc['threads']} threads ({proc['worker_threads']} in the worker pool), "
        f"{proc['blocking_calls']} blocking calls, "
        f"{proc['asyncio_tasks']} tasks, {proc['open_fds']} open fds",
        f"spool   {spool['files']} files, {size(spool['bytes'])} of {size(spool['max_bytes'])} "
        f"(at most {spool['max_files']} files) in {spool['dir']}",
    ]
    header = (
        "NAME",
        "STATE",
        "RESTARTS",
        "CALLS",
        "ERRORS",
        "IN-FLIGHT",
        "STDERR LINES",
        "PROCS",
        "RSS",
        "CPU",
    )
    rows = [(*header, "SANDBOX")]
    for ext in report["extensions"]:
        ring = f"{ext['log_lines']}/{ext['log_lines_max']}"
        rows.append((ext["name"], *_health_cells(ext, ring), sandbox_text(ext.get("sandbox"))))
        for n, instance in enumerate((ext.get("instances") or {}).get("each", ()), 1):  # per-client
            rows.append((f"  {ext['name']}[{n}]", *_health_cells(instance, "-"), "-"))
    lines.append(table(rows))
    if contain := report.get("containment"):  # `--json` has each extension's own cgroup
        where = (
            f"a cgroup each, under {contain['cgroup']}" if contain["cgroup"] else "/proc scans (no cgroup)"
        )
        lines.append(f"trees   {where}; guardian pid {contain['guardian_pid']}")
    if slots := report.get("start_slots"):
        in_use, count, queued = slots["in_use"], slots["slots"], slots["queued"]
        lines.append(f"starts  {in_use} of {count} start slots in use, {queued} queued")
    return "\n".join(lines)


def sandbox_text(sandbox: dict[str, Any] | None) -> str:
    """``network outbound, 824ade12`` (the grants digest, shortened), or ``off``."""
    if not sandbox or sandbox.get("mode") != "confined":
        return "off" if sandbox else "-"
    digest = sandbox.get("digest")
    level = f", {sandbox['confined']}" if sandbox.get("confined") else ""
    return f"network {sandbox.get('network')}" + (f", {digest[:8]}" if digest else "") + level


def _health_cells(ext: dict[str, Any], ring: str) -> tuple[str, ...]:
    counts = (ext["restarts"], ext["calls"], ext["errors"], ext["in_flight"])
    tree = ext.get("resources") or {"processes": 0, "rss_bytes": 0, "cpu_seconds": 0.0}
    usage = (str(tree["processes"]), size(tree["rss_bytes"]), f"{tree['cpu_seconds']:.1f}s")
    return (ext["state"], *map(str, counts), ring, *usage)
