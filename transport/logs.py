"""``ThrottledLog``: what remote peers can trigger (bad frames, cut bodies, failing handlers) is logged
at most ``burst`` records per ``window_s`` per server; the first record after the window says how
many were left out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, MutableMapping
from typing import Any

DEFAULT_BURST = 20
DEFAULT_WINDOW_S = 60.0


class ThrottledLog(logging.LoggerAdapter):
    """A logger adapter that lets at most ``burst`` enabled records through per ``window_s``."""

    def __init__(self, logger: logging.Logger, *, burst: int = DEFAULT_BURST, window_s: float = DEFAULT_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(logger, {})
        if isinstance(burst, bool) or not isinstance(burst, int) or burst <= 0:
            raise ValueError(f"burst must be a positive int, got {burst!r}")
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s!r}")
        self.burst = burst
        self.window_s = window_s
        self._clock = clock
        self._window_end = -float("inf")
        self._written = 0
        self.suppressed = 0  # records left out in the current window
        self.suppressed_total = 0

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        now = self._clock()
        if now >= self._window_end:
            if self.suppressed:
                self.logger.warning("%d more such log line(s) were left out in the last %.0f s (at most %d per "
                                    "window)", self.suppressed, self.window_s, self.burst)
            self._window_end, self._written, self.suppressed = now + self.window_s, 0, 0
        if self._written >= self.burst:
            self.suppressed += 1
            self.suppressed_total += 1
            return
        self._written += 1
        super().log(level, msg, *args, **kwargs)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs
