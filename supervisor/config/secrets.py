"""Secrets out of the config: ``${file:PATH}`` and ``${credential:NAME}`` in ``env`` values.

The config keeps the reference (an :class:`EnvTemplate`), never the secret: ``status``,
``check-config``, logs and reload diffs only ever see ``${file:/run/secrets/token}``. The
secret is read when the extension is spawned (:func:`resolve`), goes into the child's
environment, and nowhere else; an error names the reference, never the contents.

Rules for a secret file: a regular file (symlinks followed; a FIFO, device or directory is
refused, never waited on), at most :data:`MAX_SECRET_BYTES`, no NUL byte; one trailing newline
(``\\n`` or ``\\r\\n``) is dropped, as ``echo token > file`` writes one. ``${credential:NAME}``
is the file ``NAME`` in the daemon's ``$CREDENTIALS_DIRECTORY`` (systemd's ``LoadCredential=``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import anyio

from supervisor.errors import SpawnError

__all__ = ("MAX_SECRET_BYTES", "EnvTemplate", "Reference", "read_secret", "resolve")

MAX_SECRET_BYTES = 65_536  # one env value; Linux takes at most 128 KiB per environment string
CREDENTIALS = "CREDENTIALS_DIRECTORY"


@dataclass(frozen=True, slots=True)
class Reference:
    """``${KIND:TARGET}``: an absolute file path, or a credential name."""

    kind: Literal["file", "credential"]
    target: str

    def __str__(self) -> str:
        return f"${{{self.kind}:{self.target}}}"


@dataclass(frozen=True, slots=True)
class EnvTemplate:
    """An ``env`` value holding secret references: literal text and references, resolved at spawn.

    ``str()`` and ``repr()`` give the template as written (``$`` as ``$$``), never a secret,
    so the value is safe wherever a config value may end up.
    """

    parts: tuple[str | Reference, ...]

    def __str__(self) -> str:
        return "".join(part.replace("$", "$$") if isinstance(part, str) else str(part) for part in self.parts)

    def __repr__(self) -> str:
        return f"EnvTemplate({str(self)!r})"


def read_secret(reference: Reference, credentials: str | None) -> str:
    """The secret *reference* names, as text for the environment. Blocking, bounded.

    Error handling: :class:`SpawnError` (permanent) naming the reference and what is wrong.
    """
    path = reference.target
    if reference.kind == "credential":
        if not credentials:
            raise _failed(reference, f"${CREDENTIALS} is not set (the unit's LoadCredential= sets it)")
        path = os.path.join(credentials, reference.target)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)  # a FIFO: no wait
    except FileNotFoundError:
        raise _failed(reference, "no such file") from None
    except OSError as exc:
        raise _failed(reference, (exc.strerror or type(exc).__name__).lower()) from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise _failed(reference, "not a regular file")
        if status.st_size > MAX_SECRET_BYTES + 2:
            raise _failed(reference, f"over {MAX_SECRET_BYTES} bytes")
        data = b""
        while len(data) < MAX_SECRET_BYTES + 2 and (chunk := os.read(fd, MAX_SECRET_BYTES + 2 - len(data))):
            data += chunk  # + 2: room for the trailing newline dropped below
    except OSError as exc:
        raise _failed(reference, (exc.strerror or type(exc).__name__).lower()) from None
    finally:
        os.close(fd)
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    if len(data) > MAX_SECRET_BYTES:
        raise _failed(reference, f"over {MAX_SECRET_BYTES} bytes")
    if b"\0" in data:
        raise _failed(reference, "contains a NUL byte, which an environment variable cannot hold")
    return os.fsdecode(data)  # any bytes: the child gets them back as they are


def _failed(reference: Reference, why: str) -> SpawnError:
    return SpawnError(f"{reference}: {why}", permanent=True)


async def resolve(
    env: Mapping[str, str | EnvTemplate], credentials: str | None, *, field: str = "env"
) -> Mapping[str, str]:
    """*env* with every :class:`EnvTemplate` filled in (read in a thread); *env* itself if none.
    *field*: what the values are, for the error (``env``, ``headers``).

    Error handling: :class:`SpawnError` (permanent) naming the variable and the reference.
    """
    templates = {name: value for name, value in env.items() if isinstance(value, EnvTemplate)}
    if not templates:
        return env  # type: ignore[return-value]  # only str values

    def fill() -> dict[str, str]:
        filled: dict[str, str] = {}
        for name, template in templates.items():
            try:
                filled[name] = "".join(
                    part if isinstance(part, str) else read_secret(part, credentials)
                    for part in template.parts
                )
            except SpawnError as exc:
                raise SpawnError(f"{field} {name}: {exc}", permanent=True) from None
        return filled

    return {**env, **await anyio.to_thread.run_sync(fill)}  # type: ignore[dict-item]
