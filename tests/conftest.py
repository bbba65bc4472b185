"""Registers the suite's fixtures; they live in tests/harness/fixtures.py, with the rest of the harness."""

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
    temporary_directory,
)
