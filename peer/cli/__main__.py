"""``python -m gossamer.peer.cli``: the ``gossamer`` command (what the console script runs)."""

import sys

from gossamer.peer.cli.main import main

sys.exit(main())
