"""The stdio connection to one running extension: bytes to messages and back.

``connection`` (spawn, the pipes, the SDK session and the raw calls beside it), ``wire`` (the
stdin outbox and the child's requests bounded), ``rawcalls`` (tool calls as plain JSON, for the fast
path), ``pipes`` (stdout split into messages, its media spooled as it streams in).
"""

__all__ = ()  # the modules are the public surface
