"""One supervised extension: ``supervised`` (the Extension: state, lifetimes, what it offers), with
its ``watcher`` (the task that runs the child) and its ``calls`` (requests forwarded to it) mixed in.

Beside it: ``state`` (the vocabulary: states, snapshots), ``backoff`` (restart delays and the
policy, pure), ``startup`` (start slots and start deadlines), ``liveness`` (pings), ``asking``
(who a child's question goes to), ``demand`` (started by a call, stopped when idle), ``saved``
(listings kept on disk), ``pins`` (tool definitions pinned), ``instances`` (one per client).
"""

__all__ = ()  # the modules are the public surface
