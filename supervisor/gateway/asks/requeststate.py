"""The ``requestState`` of an input-required result: a sealed name of a parked call.

``msv1.`` + base64url(handle, round, HMAC-SHA256 tag), under a key drawn when the daemon starts:
unforgeable, and void after a restart. It carries nothing a client may not read (a random
handle and a round number); what a retry must match lives in the gateway's table, not here.
Pure but for the key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

__all__ = ("HANDLE_BYTES", "PREFIX", "Seal")

PREFIX = "msv1."
HANDLE_BYTES = 16
_ROUND, _TAG = 4, 16
_LABEL = b"mcp-supervisor/requestState/v1:"
_MAX_LENGTH = 100  # a sealed state is 53 characters; anything much longer is not ours


class Seal:
    """Seals and opens request states under one key (a fresh one per daemon run by default)."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else os.urandom(32)

    def seal(self, handle: bytes, round_: int) -> str:
        number = round_.to_bytes(_ROUND, "big")
        raw = handle + number + self._tag(handle, number)
        return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def open(self, state: str) -> tuple[bytes, int] | None:
        """(handle, round) of a state this seal made, or None (altered, foreign, another key)."""
        raw = b""
        if state.startswith(PREFIX) and len(state) < _MAX_LENGTH:
            text = state.removeprefix(PREFIX)
            try:
                raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            except ValueError:
                return None
        handle, number = raw[:HANDLE_BYTES], raw[HANDLE_BYTES : HANDLE_BYTES + _ROUND]
        tag = raw[HANDLE_BYTES + _ROUND :]
        if len(raw) != HANDLE_BYTES + _ROUND + _TAG:
            return None
        if not hmac.compare_digest(tag, self._tag(handle, number)):
            return None
        return handle, int.from_bytes(number, "big")

    def _tag(self, handle: bytes, number: bytes) -> bytes:
        return hmac.new(self._key, _LABEL + handle + number, hashlib.sha256).digest()[:_TAG]
