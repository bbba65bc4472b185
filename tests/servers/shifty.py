"""Fixture: a server whose tool definitions come from a file the test rewrites (for pinning tests).

``SHIFTY_TOOLS`` names a JSON file ``{"NAME": {"description": ..., "inputSchema": ...}, ...}``
(any tool-definition keys), read again at every ``tools/list``; each of those tools answers
``NAME: DESCRIPTION`` with the description read at the call. ``announce()`` is always listed:
it sends ``notifications/tools/list_changed``, then answers "announced".
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

import _raw

PATH = os.environ["SHIFTY_TOOLS"]


def _definitions() -> dict[str, dict[str, Any]]:
    with open(PATH) as file:
        return json.load(file)


class FileTool(_raw.Tool):
    """A tool defined by its entry in the file."""

    def __init__(self, name: str) -> None:
        super().__init__(self.answer)
        self.name = name

    def definition(self) -> dict[str, Any]:
        return _definitions().get(self.name, {})

    def describe(self, name: str) -> dict[str, Any]:
        return {"inputSchema": {"type": "object"}, **self.definition(), "name": name}

    def answer(self, args: _raw.Args) -> _raw.Content:
        return [_raw.text(f"{self.name}: {self.definition().get('description', '')}")]


def announce(args: _raw.Args) -> _raw.Content:
    """Tell the client the tool list changed (before the answer, as a server may)."""
    _raw.write_raw(b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n')
    return [_raw.text("announced")]


class Tools(Mapping[str, _raw.Tool]):
    """The file's tools (read at each lookup), then ``announce``."""

    fixed = {"announce": _raw.Tool(announce, "Send tools/list_changed.")}

    def _names(self) -> list[str]:
        return [*_definitions(), *self.fixed]

    def __getitem__(self, name: str) -> _raw.Tool:
        if name in self.fixed:
            return self.fixed[name]
        if name in _definitions():
            return FileTool(name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


if __name__ == "__main__":
    _raw.serve("shifty", Tools())
