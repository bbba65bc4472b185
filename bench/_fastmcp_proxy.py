"""FastMCP's proxy over stdio for ``bench/gateway.py``: run by ``bench/.venv-fastmcp``'s Python.

python bench/_fastmcp_proxy.py CMD ARGS...   serve CMD (an stdio MCP server) through ``create_proxy``
"""

import sys

from fastmcp.server import create_proxy

if __name__ == "__main__":
    config = {"mcpServers": {"echo": {"command": sys.argv[1], "args": sys.argv[2:]}}}
    create_proxy(config, name="bench-proxy").run(show_banner=False)
