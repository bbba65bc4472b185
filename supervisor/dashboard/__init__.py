"""The dashboard: a web page of the host's MCP servers, served by the daemon on its HTTP listener.

:mod:`.passes` decides who may see it (one-time codes that become session cookies),
:mod:`.live` tells its open pages of changes, :mod:`.pages` is the ASGI app, and ``static/``
holds the page itself (HTML, CSS and one script; no build step, nothing from elsewhere).
"""

__all__ = ()  # the modules are the public surface
