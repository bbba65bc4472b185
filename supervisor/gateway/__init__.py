"""The MCP gateway: one MCP server view of every running extension, for every client on the host.

Modules: ``names`` (the pure name table), ``catalog`` (what the clients see, from listings),
``server`` (the lowlevel SDK ``Server``, its handlers and forwarding), ``fanout`` and
``clients`` (notifications to every client; one object per client connection), ``spoollinks``
(serving spool files), ``listeners`` (``mcp.sock``), ``http`` (streamable HTTP), ``connect``
(the stdio pump a client configures). It reads extension snapshots and borrows their sessions;
it never opens or closes one.
"""

__all__ = ()  # the modules are the public surface: gateway.server.Gateway, gateway.listeners, ...
