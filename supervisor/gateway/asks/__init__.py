"""A child's questions mid-call (sampling, elicitation, roots), put to the client whose call it is.

``callers`` (how a client is asked on either path), ``inputrequired`` (2026-07-28 clients: the
call parks and the question goes out as an input-required result), ``requeststate`` (the
sealed token that names a parked call).
"""

__all__ = ()  # the modules are the public surface
