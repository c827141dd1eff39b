"""Machine-readable progress events: one JSON object per line on stdout when ``--events`` is on. The
daemon's own are ``ready``, ``peers`` and ``stopped``; a protocol's roles emit
``<protocol>.<event>`` with the fields their plugin declares (``ProtocolPlugin.events``)."""

from __future__ import annotations

import atexit
import contextlib
import json
import queue
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, TextIO

Observer = Callable[[str, Mapping[str, Any]], None]
MAX_QUEUED = 10_000
"""Lines a buffered sink holds for a reader that fell behind (events are a few hundred bytes to a
few kB: tens of MB at most) before it drops them."""


class EventSink:
    """Writes events as JSON lines to ``stream`` (stdout by default) when ``enabled``; otherwise
    hands each to ``observer`` if there is one (a hand-started peer's human progress lines).

    With ``buffered`` (the daemon's) the lines go through a bounded queue to a writer thread, so a
    reader that falls behind (the pipe full) never blocks the event loop: the daemon keeps
    answering its peers and ``/status``. A line that finds the queue full is dropped and counted,
    and an ``events_dropped`` line says how many once there is room again (or at ``close``).
    ``flush`` waits until what was emitted so far is written; ``close`` writes what is queued and
    stops the writer (both bounded by ``timeout_s``)."""

    def __init__(self, *, enabled: bool, stream: TextIO | None = None, observer: Observer | None = None,
                 buffered: bool = False, max_queued: int = MAX_QUEUED) -> None:
        self.enabled = enabled
        self._stream = stream
        self.observer = observer
        self.dropped = 0
        self._unreported = 0
        self._queue: queue.Queue[str | threading.Event | None] | None = None
        self._writer: threading.Thread | None = None
        if enabled and buffered:
            self._queue = queue.Queue(maxsize=max_queued)
            self._writer = threading.Thread(target=self._write_lines, name="events", daemon=True)
            self._writer.start()
            atexit.register(self.close, 2.0)  # a daemon that exits another way still writes what it said

    def emit(self, event: str, **fields: Any) -> None:
        """Write ``{"event": event, **fields}`` as one line, if enabled (else tell the observer)."""
        if not self.enabled and self.observer is not None:
            self.observer(event, fields)
        if not self.enabled:
            return
        line = json.dumps({"event": event, **fields}, sort_keys=True, default=str) + "\n"
        if self._queue is None:
            self._write(line)
            return
        if self._unreported and self._offer(self._dropped_line()):
            self._unreported = 0
        if not self._offer(line):
            self.dropped += 1
            self._unreported += 1

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every line emitted before this call is written (or ``timeout_s`` passes: a
        reader that stopped reading is not waited for). True when they were."""
        if self._queue is None or self._writer is None or not self._writer.is_alive():
            return self._queue is None
        written = threading.Event()
        try:
            self._queue.put(written, timeout=timeout_s)
        except queue.Full:
            return False
        return written.wait(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write the queued lines (at most ``timeout_s``: a reader that stopped reading is not waited for)."""
        if self._queue is None or self._writer is None:
            return
        with contextlib.suppress(queue.Full):
            if self._unreported:
                self._queue.put(self._dropped_line(), timeout=timeout_s)
                self._unreported = 0
            self._queue.put(None, timeout=timeout_s)
        self._writer.join(timeout_s)

    def _dropped_line(self) -> str:
        return json.dumps({"event": "events_dropped", "count": self._unreported}) + "\n"

    def _offer(self, line: str) -> bool:
        assert self._queue is not None
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            return False
        return True

    def _write(self, line: str) -> bool:
        stream = self._stream or sys.stdout
        try:
            stream.write(line)
            stream.flush()
        except (BrokenPipeError, ValueError):  # the reader is gone, or the stream closed
            return False
        return True

    def _write_lines(self) -> None:
        assert self._queue is not None
        while (line := self._queue.get()) is not None:
            if isinstance(line, threading.Event):
                line.set()
            elif not self._write(line):
                return
