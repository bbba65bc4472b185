"""What reaches clients unasked: list changes, log messages, resource updates.

``fanout`` (one audience for every producer), ``downstream`` (one client's pending notifications),
``listen`` and ``releases`` (2026-07-28 subscription streams, and telling children when nobody
holds a resource any more), ``requestlogs`` (a 2026-07-28 request's own log messages).
"""

__all__ = ()  # the modules are the public surface
