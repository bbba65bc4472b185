"""Processes: spawning children, containing their whole trees, and confining them.

``children`` (spawn a child, notice its exit, sweep leftovers), ``spawner`` (fork+exec on one
thread), ``teardown`` (kill a tree), ``containment``, ``cgroups``, ``tree`` and ``guardian`` (what
keeps every descendant accountable, even past a SIGKILLed daemon), ``reaper`` (a subreaper's
orphans), ``usage`` (RSS and CPU of a tree), ``sandbox/`` (what a child may read, write and reach).

This package's face imports nothing: the guardian runs ``tree`` and ``cgroups`` in a bare
``python -I -S`` and must not pay for the rest.
"""

__all__ = ()  # the modules are the public surface
