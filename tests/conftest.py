"""Registers the suite's fixtures; they live in tests/harness/fixtures.py, with the rest of the harness."""

import pytest

from tests.harness.fixtures import (  # noqa: F401 - fixtures are found by name
    anyio_backend,
    daemons,
    gateway,
    hostile,
    http_gateway,
    make_extension,
    marker_prefix,
    ondemand,
    pinned,
    short_tmp,
    state_directory,
    task_group,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests first: one started last would run on alone and set the suite's wall time."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
