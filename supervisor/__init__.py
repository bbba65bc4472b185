"""mcp-supervisor: a process supervisor for stdio MCP servers."""

__all__ = ("__version__",)

__version__ = "0.1.0"
