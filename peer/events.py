"""Machine-readable progress events: one JSON object per line on stdout when ``--events`` is on
(``gossamer swarm``, the end-to-end tests and scripts read them).

The daemon's own events are ``ready``, ``peers`` and ``stopped``; a protocol's roles emit
``<protocol>.<event>`` through ``ProtocolRole.emit``, with the fields their plugin documents
(``ProtocolPlugin.events``; listed in docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, TextIO

Observer = Callable[[str, Mapping[str, Any]], None]


class EventSink:
    """Writes events as JSON lines to ``stream`` (stdout by default) when ``enabled``; otherwise
    hands each to ``observer`` if there is one (a hand-started peer's human progress lines)."""

    def __init__(self, *, enabled: bool, stream: TextIO | None = None, observer: Observer | None = None) -> None:
        self.enabled = enabled
        self._stream = stream
        self.observer = observer

    def emit(self, event: str, **fields: Any) -> None:
        """Write ``{"event": event, **fields}`` as one line, if enabled (else tell the observer)."""
        if not self.enabled and self.observer is not None:
            self.observer(event, fields)
        if self.enabled:
            stream = self._stream or sys.stdout
            stream.write(json.dumps({"event": event, **fields}, sort_keys=True, default=str) + "\n")
            stream.flush()
