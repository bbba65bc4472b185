"""The fast path: plain tool calls served beside the SDK, without its models.

``parse`` says which lines are plain calls (pure), ``runner`` serves them for every front-end
(one table of running calls, one cancel), and ``answers`` writes what they answer (pure). The
front-ends, each deciding only what its transport decides: ``..stdio`` (``mcp.sock``),
``..http.fastcalls`` (a POST in its ASGI task) and ``..http.quick`` (a POST in its
connection's callbacks). ``docs/architecture.md`` lists every path a call can take.
"""

__all__ = ()  # the modules are the public surface
