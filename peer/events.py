"""Machine-readable progress events: one JSON object per line on stdout when ``--events`` is on
(``gossamer swarm`` and the end-to-end tests read them)."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit(enabled: bool, event: str, **fields: Any) -> None:
    """Write ``{"event": event, **fields}`` as one line, if ``enabled``."""
    if enabled:
        sys.stdout.write(json.dumps({"event": event, **fields}, sort_keys=True, default=str) + "\n")
        sys.stdout.flush()
