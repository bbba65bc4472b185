"""A remote MCP server as an upstream: streamable HTTP (both protocol eras) or HTTP+SSE.

``upstream`` (a run as the extension sees it; ``type: auto``'s fallback), ``connection`` (the
transport and the session over it, held by one task), ``rawcalls`` (plain tool calls posted
beside the session), ``traffic`` (what of a run's traffic ends it; the session's write
stream), ``http`` (the HTTP client: verified, every answer and event bounded).
"""

__all__ = ()  # the modules are the public surface
