"""``python -m supervisor``: the same as the ``mcp-supervisor`` command."""

import sys

from .cli import main

sys.exit(main())
