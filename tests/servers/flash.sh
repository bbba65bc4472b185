#!/bin/sh
# An MCP server that answers initialize and tools/list, then exits 1 at once: with
# backoff 0 it restarts as fast as a process can start. For the bounded-state tests.
while IFS= read -r line; do
  id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9][0-9]*\).*/\1/p')
  case "$line" in
    *'"method":"initialize"'*)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"flash","version":"0"}}}\n' "$id" ;;
    *'"method":"tools/list"'*)
      printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"noop","inputSchema":{"type":"object"}}]}}\n' "$id"
      echo "flash: up, leaving" >&2
      exit 1 ;;
  esac
done
