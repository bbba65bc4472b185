"""The first line ``connect --profile NAME`` sends on ``mcp.sock``: the gateway's one word of its own.

A constant both ends share. The client side (:mod:`supervisor.cli.connect`) imports it without
importing the gateway: this module imports nothing.
"""

__all__ = ("HELLO_METHOD",)

HELLO_METHOD = "mcp-supervisor/profile"  # params {"name": PROFILE}; answered before anything else
