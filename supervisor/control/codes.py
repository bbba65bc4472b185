"""Error codes of the control protocol, shared by the server (control.py) and the client."""

__all__ = (
    "CALL_FAILED",
    "CONFIG_INVALID",
    "EXTENSION_UNAVAILABLE",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "SUPERVISOR_ERROR",
    "UNKNOWN_EXTENSION",
)

# JSON-RPC 2.0 standard codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Application codes (the -32000..-32099 "server error" range).
SUPERVISOR_ERROR = -32000
CALL_FAILED = -32002
EXTENSION_UNAVAILABLE = -32003  # data: {"state", "retryable"}
UNKNOWN_EXTENSION = -32004
CONFIG_INVALID = -32005  # data: {"errors": [one line per problem]}
