"""``python -m supervisor.cli``: the same as the ``mcp-supervisor`` command."""

import sys

from supervisor.cli import main

sys.exit(main())
