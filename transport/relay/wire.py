"""What both ends of a relay share: small JSON control messages, one per line, and the splice
that moves bytes between two connections under a shared pace (``Pace``) with an idle deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from gossamer.transport.errors import ConnectionClosed, DecodeError, TransportTimeout

MAX_LINE_BYTES = 8192
CHUNK_BYTES = 256 * 1024


async def read_message(reader: asyncio.StreamReader, *, timeout_s: float) -> dict[str, Any]:
    """One control message; ConnectionClosed at EOF, DecodeError for a bad or oversized line,
    TransportTimeout when none arrives within ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            line = await reader.readuntil(b"\n")
    except TimeoutError:
        raise TransportTimeout(f"no relay control message within {timeout_s} s") from None
    except asyncio.IncompleteReadError as exc:
        raise ConnectionClosed("the relay connection closed") from exc
    except asyncio.LimitOverrunError as exc:
        raise DecodeError(f"relay control line over {MAX_LINE_BYTES} bytes") from exc
    except OSError as exc:
        raise ConnectionClosed(f"the relay connection failed: {exc}") from exc
    if len(line) > MAX_LINE_BYTES:
        raise DecodeError(f"relay control line over {MAX_LINE_BYTES} bytes")
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, ValueError) as exc:
        raise DecodeError("relay control line is not JSON") from exc
    if not isinstance(message, dict):
        raise DecodeError("relay control message is not an object")
    return message


def write_message(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")


class Pace:
    """A token bucket in bytes per second shared by every connection of one relayed peer (0: no cap)."""

    def __init__(self, rate_bytes_per_s: float, *, burst_bytes: int = 4 * CHUNK_BYTES) -> None:
        self.rate = float(rate_bytes_per_s)
        self.burst = float(max(burst_bytes, CHUNK_BYTES))
        self._tokens = self.burst
        self._at = time.monotonic()
        self.moved = 0

    async def take(self, nbytes: int) -> None:
        self.moved += nbytes
        if self.rate <= 0:
            return
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= nbytes
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.rate)


async def splice(a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 b: tuple[asyncio.StreamReader, asyncio.StreamWriter], *, pace: Pace, idle_timeout_s: float) -> None:
    """Move bytes both ways until both directions end (a half-close is passed on), a connection
    fails, or nothing moves for ``idle_timeout_s``; then close both."""
    tasks = [asyncio.create_task(_pump(a[0], b[1], pace, idle_timeout_s), name="relay-pump"),
             asyncio.create_task(_pump(b[0], a[1], pace, idle_timeout_s), name="relay-pump")]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _reader, writer in (a, b):
            writer.close()
        for _reader, writer in (a, b):
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pace: Pace, idle_timeout_s: float) -> None:
    while True:
        async with asyncio.timeout(idle_timeout_s):
            data = await reader.read(CHUNK_BYTES)
        if not data:
            if writer.can_write_eof():
                writer.write_eof()
            return
        await pace.take(len(data))
        writer.write(data)
        async with asyncio.timeout(idle_timeout_s):
            await writer.drain()
