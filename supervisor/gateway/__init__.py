"""The MCP gateway: one MCP server view of every running extension, for every client on the host.

Where a client comes in: ``unix`` (``mcp.sock``) and ``http/`` (streamable HTTP). What serves
it: ``server`` (the SDK's lowlevel ``Server`` and its handlers) and ``fast/`` (plain tool
calls without the SDK, one runner behind every front-end), both routing through ``catalog``
and ``names`` (the pure name table) within the client's view (``view/``). A child's questions
go back to the calling client (``asks/``), tasks are routed by id (``tasks/``), notifications
reach the clients that want them (``notify/``), and the spool's links are served by
``spoollinks``. It reads extension snapshots and borrows their sessions; it never opens or
closes one.
"""

__all__ = ()  # the modules are the public surface
