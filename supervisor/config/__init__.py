"""Configuration: the settings (``settings``), the YAML/JSON file reader (``file``), and the files
of MCP clients (``clientkeys``, ``importer``, ``migrate``, ``snippets``, ``runners``). ``secrets``
reads ``${file:...}`` and ``${credential:...}`` references at spawn time.

Values only: nothing here runs anything. The daemon and the CLI load settings; the rest of the
package receives plain frozen values.
"""

__all__ = ()  # the modules are the public surface
