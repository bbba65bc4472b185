"""Registers the suite's fixtures; they live in tests/harness/fixtures.py, with the rest of the harness.

Also scales every test's pytest-timeout by ``SUPERVISOR_TEST_SLOWDOWN`` (tests/harness/timing.py),
and adds the end of each daemon's log to the report of a test that failed.
"""

from collections.abc import Iterator

import pytest

from tests.harness.fixtures import (  # noqa: F401 - fixtures are found by name
    anyio_backend,
    daemons,
    gateway,
    hostile,
    http_gateway,
    logs_of,
    make_extension,
    marker_prefix,
    ondemand,
    pinned,
    short_tmp,
    state_directory,
    task_group,
    temporary_directory,
)
from tests.harness.timing import SLOWDOWN


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SLOWDOWN == 1:
        return
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = float(marker.args[0] if marker.args else marker.kwargs["timeout"]) if marker else default
        if seconds > 0:
            item.add_marker(pytest.mark.timeout(seconds * SLOWDOWN), append=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.failed and call.when == "call":
        report.sections.extend(logs_of(item))
