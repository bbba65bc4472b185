"""``check-config --explain`` of a remote server: nothing of it to confine, and how it logs in.

Apart from :mod:`.auth`, which imports the SDK's OAuth client: the CLI explains without it.
"""

from __future__ import annotations

from supervisor.config.extension import RemoteConfig

__all__ = ("explain",)


def explain(name: str, config: RemoteConfig) -> list[str]:
    """The lines of ``check-config --explain NAME`` for remote server *name*."""
    lines = [
        f"{name}: a remote server ({config.url}): nothing of it runs on this host, so there is "
        "nothing to confine; the daemon sends its headers to that origin only"
    ]
    if config.logs_in:
        how = (
            "as its own client (client_credentials)"
            if config.oauth.grant == "client_credentials"
            else f"once for the host: `mcp-supervisor login {name}`"
        )
        lines.append(
            f"  OAuth: when the server asks, the daemon logs in {how}; tokens stay in the daemon's "
            "state directory (0600), never in a child's view, a log or status"
        )
    return lines
