"""What one run of an extension offers: its tools, prompts, resources and templates, as one value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mcp_types as types

__all__ = ("Listing",)


@dataclass(frozen=True, slots=True)
class Listing:
    """What one run of an extension offers, in the server's order. Replaced whole, never changed.

    The models are shared with every reader: copy one (``model_copy``) before changing it.
    """

    tools: tuple[types.Tool, ...] = ()
    prompts: tuple[types.Prompt, ...] = ()
    resources: tuple[types.Resource, ...] = ()
    templates: tuple[types.ResourceTemplate, ...] = ()
    tool_names: frozenset[str] = field(default=frozenset(), compare=False)

    @classmethod
    def of(cls, tools: Any = (), prompts: Any = (), resources: Any = (), templates: Any = ()) -> Listing:
        tools = tuple(tools)
        return cls(
            tools, tuple(prompts), tuple(resources), tuple(templates), frozenset(t.name for t in tools)
        )
