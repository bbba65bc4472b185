"""Resource URIs inside results, as clients must read them back: through the gateway. Pure.

A child's resource links and embedded resources name its own URIs; clients get them as
``mcp-supervisor://EXTENSION/ORIGINAL`` (:func:`~.names.expose_uri`), so that ``resources/read``
reaches the right extension. Spool links stay ``file://`` links: the gateway serves those itself
(a string test is enough here, since ``resources/read`` opens nothing outside the spool).
:func:`expose_models` rewrites the SDK's models (its handlers), :func:`expose_json` plain JSON
(the fast path and tasks, which never build models).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mcp_types as types

from supervisor.gateway.names import expose_uri

__all__ = ("expose_json", "expose_models")


def expose_models(extension: str, content: Sequence[Any], spool_prefix: str) -> list[Any]:
    """Content models with their URIs as clients must read them back."""
    exposed = []
    for item in content:
        if isinstance(item, types.ResourceLink) and not item.uri.startswith(spool_prefix):
            item = item.model_copy(update={"uri": expose_uri(extension, item.uri)})
        elif isinstance(item, types.EmbeddedResource):
            resource = item.resource.model_copy(update={"uri": expose_uri(extension, item.resource.uri)})
            item = item.model_copy(update={"resource": resource})
        exposed.append(item)
    return exposed


def expose_json(extension: str, content: list[Any], spool_prefix: str) -> list[Any]:
    """The plain-JSON twin of :func:`expose_models`."""
    exposed = []
    for item in content:
        if isinstance(item, dict):
            kind = item.get("type")
            uri = item.get("uri")
            if kind == "resource_link" and isinstance(uri, str) and not uri.startswith(spool_prefix):
                item = {**item, "uri": expose_uri(extension, uri)}
            elif (
                kind == "resource"
                and isinstance(resource := item.get("resource"), dict)
                and isinstance(inner := resource.get("uri"), str)
            ):
                item = {**item, "resource": {**resource, "uri": expose_uri(extension, inner)}}
        exposed.append(item)
    return exposed
