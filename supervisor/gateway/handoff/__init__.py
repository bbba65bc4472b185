"""Fd passing: ``connect`` hands its client's stdio to the daemon, which then serves it directly.

``journal`` is the shared memory both ends read (the daemon writes it, ``connect`` reads it
after a daemon died), ``stream`` the daemon's stream over the client's pipes. The wire words
(the handoff request, the lines on the socket afterwards) are in :mod:`.journal` too, so that
``connect`` imports one small module of the gateway and nothing else.
"""

__all__ = ()
