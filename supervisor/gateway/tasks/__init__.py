"""Tasks (MCP 2025-11-25) through the gateway: ``router`` (calls and ``tasks/*`` by namespaced id)
and ``owners`` (which client created each task)."""

__all__ = ()  # the modules are the public surface
