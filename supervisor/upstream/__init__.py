"""What every upstream kind shares: the MCP client session, its listings and wire rules.

``session`` (the handshake-era client session and what needs only it), ``listing`` (what a run
offers), ``wire`` (the ids a task sends, late answers watched, what JSON cannot carry),
``spool`` and ``media`` (oversized images, audio and blobs in results to disk, a link instead).

An extension runs over an upstream (:class:`supervisor.extension.upstream.Upstream`); each kind
(``child``: a stdio child; ``remote``: a server over streamable HTTP or SSE) opens a transport
and builds on :class:`~supervisor.upstream.session.SessionUpstream`.
"""

__all__ = ()  # the modules are the public surface
