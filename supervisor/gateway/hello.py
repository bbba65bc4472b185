"""The gateway's words of its own on ``mcp.sock``, which ``connect`` sends before the client's first byte.

Constants both ends share. The client side (:mod:`supervisor.cli.connect`) imports them without
importing the gateway: this module imports nothing.

- ``connect --profile NAME`` opens with a :data:`HELLO_METHOD` request.
- ``connect`` may open with a :data:`HANDOFF_METHOD` request instead, the client's stdin and
  stdout attached (SCM_RIGHTS), or send one with ``{"switch": true}`` on a live session (after
  a daemon restart), answered ``{"ready": true}``, then one byte (:data:`SWITCH_FDS`) with the
  fds: the daemon then serves the client on them directly, answers
  with the session's journal (a memfd, :mod:`.handoff.journal`); once connect acknowledges it
  (:data:`TAKEN`: until then the daemon does not touch the fds), the daemon writes only the
  lines below on the socket, each a tag byte, a payload and a newline.
"""

__all__ = (
    "ANSWERED",
    "BYE",
    "HANDOFF_ID",
    "HANDOFF_METHOD",
    "HELD_LONG",
    "HELLO_METHOD",
    "RELEASED_LONG",
    "SET_UP",
    "SET_UP_MAX",
    "SET_UP_METHODS",
    "SWITCH_FDS",
    "TAKEN",
)

HELLO_METHOD = "mcp-supervisor/profile"  # params {"name": PROFILE}; answered before anything else
HANDOFF_METHOD = "mcp-supervisor/handoff"  # params {"profile": PROFILE | null}; fds: stdin, stdout
HANDOFF_ID = "mcp-supervisor-connect-handoff"
TAKEN = b"K"  # connect's one byte after the answer: it has the journal, the daemon may serve
SWITCH_FDS = b"F"  # on a live session, once the daemon is ready: the byte the client's fds come with

# After a handoff, the daemon's lines to connect (what connect must know to resume elsewhere):
SET_UP = b"S"  # + a client line that sets the session up (initialize, setLevel, subscribe, listen...)
ANSWERED = b"A"  # + the JSON id of such a request, now answered
HELD_LONG = b"I"  # + a JSON id too long for a journal slot: a request now in flight
RELEASED_LONG = b"R"  # + that id: answered
BYE = b"B"  # the client ended (its stdin, or its stdout went): connect exits

SET_UP_METHODS = frozenset(
    {
        "initialize",
        "notifications/initialized",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "subscriptions/listen",
        "notifications/cancelled",  # of a listen: it ends
    }
)
SET_UP_MAX = 1 << 20  # a set-up line longer than this is not replayed (connect would not keep it)
