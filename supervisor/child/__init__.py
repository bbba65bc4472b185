"""The stdio connection to one running extension: bytes to messages and back.

``connection`` (spawn, the pipes, the SDK session and the raw calls beside it), ``wire`` (the
stdin outbox and the child's requests bounded), ``rawcalls`` (tool calls as plain JSON, for the fast
path), ``spool`` and ``media`` (oversized images, audio and blobs to disk, as they stream in).
"""

__all__ = ()  # the modules are the public surface
