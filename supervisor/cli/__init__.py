"""The ``mcp-supervisor`` command: ``main`` (parse, dispatch, exit codes), ``remote`` and ``local``
(the commands), ``render`` (tables), ``connect/`` (the stdio pump MCP clients run), ``demo``.
"""

from supervisor.cli.main import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, main

__all__ = ("EXIT_FAILED", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "main")
