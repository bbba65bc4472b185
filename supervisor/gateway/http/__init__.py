"""The gateway over streamable HTTP: ``/mcp`` (and ``/mcp/NAME``), ``/metrics`` and ``/healthz``.

The listener is bounded like ``mcp.sock`` (:class:`.limits.HttpLimits`). Modules, in the order
a request meets them: ``connections`` (the connection cap, deadlines for headers, bodies and
unread answers, on uvicorn's protocol), ``guard`` (Host, Origin and the token; profile paths),
``bodies`` (one budget for bodies being received; requests in flight per session),
``sessions`` (the SDK's session manager with a cap that ends the idlest session), and
``listener`` (uvicorn in the daemon's task group).
"""

from supervisor.gateway.http.limits import HttpLimits
from supervisor.gateway.http.listener import HttpApp, Listening, build_app, serve_http

__all__ = ("HttpApp", "HttpLimits", "Listening", "build_app", "serve_http")
