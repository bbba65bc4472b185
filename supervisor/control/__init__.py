"""The control socket: the JSON-RPC protocol the CLI speaks to the daemon.

``server`` (the listener and its bounds), ``rpc`` (framing and dispatch, pure), ``methods`` (one
handler per method, on a ``Backend``), ``codes`` (the error codes), ``client`` (what the CLI uses).
"""

__all__ = ()  # the modules are the public surface
