"""Test support: one daemon harness, the fixture servers' helpers, one fake backend, the gateway client.

Tests import from here (``from tests.harness import Daemon, extension_settings``); tests/conftest.py
registers the fixtures of :mod:`tests.harness.fixtures`.
"""

from .backend import SINCE, FakeBackend
from .daemon import CLI, Daemon, accepts, alive, memory, rpc, until
from .fixtures import INLINE
from .gateway_client import (
    ANSWERING,
    INITIALIZE,
    MAX_LINE,
    Streams,
    elicit_yes,
    gateway_session,
    list_home,
    raw_exchange,
    sample_hi,
    unix_transport,
)
from .servers import (
    DATA,
    ECHO,
    RICH,
    ROOT,
    SERVERS,
    counted,
    eventually,
    extension_settings,
    fast_config,
    first_text,
    gated_start,
    running,
    server_argv,
    spawns,
)

__all__ = (
    "ANSWERING",
    "CLI",
    "DATA",
    "ECHO",
    "INITIALIZE",
    "INLINE",
    "MAX_LINE",
    "RICH",
    "ROOT",
    "SERVERS",
    "SINCE",
    "Daemon",
    "FakeBackend",
    "Streams",
    "accepts",
    "alive",
    "counted",
    "elicit_yes",
    "eventually",
    "extension_settings",
    "fast_config",
    "first_text",
    "gated_start",
    "gateway_session",
    "list_home",
    "memory",
    "raw_exchange",
    "rpc",
    "running",
    "sample_hi",
    "server_argv",
    "spawns",
    "unix_transport",
    "until",
)
