"""Human progress lines: one line per event a protocol describes (``ProtocolPlugin.describe_event``),
with a bar and an ETA where the plugin says how far along the run is (``ProtocolPlugin.progress``).

A peer started by hand prints them on stdout (``gossamer swarm`` prints the same lines for every
process it runs); ``--events`` prints JSON lines instead.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from gossamer.peer.plugin import ProtocolPlugin

BAR_WIDTH = 20


def bar(done: int, total: int, *, width: int = BAR_WIDTH) -> str:
    """``[#######-------------]  7/20``."""
    filled = round(width * min(done, total) / total) if total > 0 else 0
    return f"[{'#' * filled}{'-' * (width - filled)}] {done:>{len(str(total))}}/{total}"


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Turns a protocol's events into human lines, keeping what an ETA needs (per source)."""

    def __init__(self, plugin: ProtocolPlugin, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.plugin = plugin
        self._clock = clock
        self._first: dict[str, tuple[float, int]] = {}

    def line(self, event: str, fields: Mapping[str, Any], *, source: str = "") -> str | None:
        """The human line for ``event`` (``"<protocol>.<name>"``), or None if the plugin has none."""
        protocol, _dot, short = event.partition(".")
        if protocol != self.plugin.name or not short:
            return None
        text = self.plugin.describe_event(short, fields)
        if text is None:
            return None
        progress = self.plugin.progress(short, fields)
        if progress is None:
            return text
        done, total = progress
        return f"{bar(done, total)}  {text}{self._eta(f'{source}/{short}', done, total)}"

    def _eta(self, key: str, done: int, total: int) -> str:
        now = self._clock()
        first = self._first.setdefault(key, (now, done))
        started, done_then = first
        if done >= total:
            return f"  (done in {duration(now - started)})" if done > done_then else ""
        if done <= done_then:
            return ""
        return f"  ETA {duration((now - started) / (done - done_then) * (total - done))}"


class ProgressPrinter:
    """An ``EventSink`` observer that prints ``Progress`` lines to ``stream`` (stdout by default)."""

    def __init__(self, plugin: ProtocolPlugin, *, stream: TextIO | None = None) -> None:
        self.progress = Progress(plugin)
        self._stream = stream

    def __call__(self, event: str, fields: Mapping[str, Any]) -> None:
        line = self.progress.line(event, fields)
        if line is not None:
            stream = self._stream or sys.stdout
            stream.write(f"{time.strftime('%H:%M:%S')} {line}\n")
            stream.flush()
