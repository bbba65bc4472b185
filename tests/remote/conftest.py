"""The ``remotes`` fixture: fixture servers in a mode, killed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.remote import Remote


@pytest.fixture
def remotes() -> Iterator[Callable[[str], Remote]]:
    started: list[Remote] = []

    def start(mode: str) -> Remote:
        started.append(Remote(mode).start())
        return started[-1]

    yield start
    for remote in started:
        remote.kill()
