"""What both ends of a relay share: small JSON control messages, one per line, and ``Pipe``, the
asyncio protocol that splices two connections under a shared pace (``Pace``): through the kernel
(``splice``) where it can, copying through Python where not."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from gossamer.transport.errors import ConnectionClosed, DecodeError, TransportTimeout
from gossamer.transport.logs import ThrottledLog
from gossamer.transport.relay.splice import Splice, usable

log = ThrottledLog(logging.getLogger(__name__))

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
    """A token bucket in bytes per second shared by every connection of one relayed peer (0: no cap).

    It starts full (``burst_bytes``) and refills at the rate up to that; a mover moves a chunk,
    debits it, and pauses for the seconds ``debit`` answers (what brings the bucket back to empty),
    so over any window of ``w`` seconds at most ``burst + rate * w`` bytes, plus the one chunk each
    mover debits before it learns to pause, get through. ``clock`` is monotonic seconds (a
    parameter so the decisions can be checked against a clock a test drives).
    """

    def __init__(self, rate_bytes_per_s: float, *, burst_bytes: int = 4 * CHUNK_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not rate_bytes_per_s >= 0:
            raise ValueError(f"rate_bytes_per_s must be >= 0, got {rate_bytes_per_s!r}")
        self.rate = float(rate_bytes_per_s)
        self.burst = float(max(burst_bytes, CHUNK_BYTES))
        self._clock = clock
        self._tokens = self.burst
        self._at = clock()
        self.moved = 0

    def debit(self, nbytes: int) -> float:
        """Count ``nbytes`` moved; the seconds the mover should pause to stay within the rate."""
        self.moved += nbytes
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= nbytes
        return -self._tokens / self.rate if self._tokens < 0 else 0.0


class Pipe(asyncio.Protocol):
    """One end of a splice: what it receives is written to its peer's transport as it arrives
    (asyncio's own buffers), with flow control both ways (a full peer pauses our reading), a
    half-close passed on, and a close of either end, or the end of both ways, closing both.

    Before ``pair`` it holds what arrives (``hold_bytes`` at most, then reading pauses). With
    ``on_line`` it first reads one control line (``MAX_LINE_BYTES`` at most) and hands it over,
    decoded, with itself; the bytes after it are held for the peer; an end of stream before the
    line closes it. When both ends of a pair have
    ``zero_copy`` and ``splice.usable`` says so, a ``Splice`` moves their bytes from then on
    (same pace, flow control and half-close; no byte through Python).
    """

    def __init__(self, *, pace: Pace | None = None, on_line: Callable[[dict[str, Any], Pipe], None] | None = None,
                 on_made: Callable[[Pipe], None] | None = None, hold_bytes: int = CHUNK_BYTES,
                 zero_copy: bool = False) -> None:
        self.pace = pace or Pace(0)
        self.zero_copy = zero_copy
        self._splice: Splice | None = None
        self.transport: asyncio.Transport | None = None
        self.peer: Pipe | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._on_line = on_line
        self._on_made = on_made
        self._held = bytearray()
        self._hold_bytes = hold_bytes
        self._pauses: set[str] = set()
        self._eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self._on_made is not None:
            self._on_made(self)

    def pair(self, peer: Pipe) -> None:
        """Splice this end to ``peer``: each passes on what it held and everything after."""
        self.peer, peer.peer = peer, self
        if self.zero_copy and peer.zero_copy and usable(self.transport, peer.transport):
            held = (bytes(self._held), bytes(peer._held))
            self._held.clear()
            peer._held.clear()
            try:
                self._splice = peer._splice = Splice.start(self, peer, held=held, ended=(self._eof, peer._eof))
            except OSError as exc:  # out of descriptors: this connection is dropped, as one over a cap is
                log.warning("cannot splice a relayed connection: %s", exc)
                self.close()
                peer.close()
            return
        for end in (self, peer):
            end._flush()

    @property
    def spliced(self) -> bool:
        return self._splice is not None

    def close(self) -> None:
        if self._splice is not None:
            self._splice.stop()
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._on_line is not None:
            self._read_line(data)
        elif self.peer is None or self.peer.transport is None:
            self._hold(data)
        else:
            self._forward(data)

    def eof_received(self) -> bool:
        self._eof = True
        if self._on_line is not None:  # it ended before its line: nothing will come of it
            self.close()
            return False
        if self.peer is not None and self.peer.transport is not None and not self._held:
            if self.peer.transport.can_write_eof():
                self.peer.transport.write_eof()
            else:
                self.peer.close()
            if self.peer._eof and not self.peer._held:  # both ways ended: close both (after what is buffered)
                self.peer.close()
                self.close()
        return True  # keep our sending half open for the peer's answer

    def connection_lost(self, exc: Exception | None) -> None:
        if self._splice is not None:
            self._splice.stop()
        if self.peer is not None:
            self.peer.close()
        if not self.done.done():
            self.done.set_result(None)

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer._pause("peer-full")

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer._resume("peer-full")

    def _read_line(self, data: bytes) -> None:
        self._held += data
        end = self._held.find(b"\n")
        if end < 0:
            if len(self._held) > MAX_LINE_BYTES:
                self.close()
            return
        line, rest = bytes(self._held[:end]), bytes(self._held[end + 1:])
        self._held.clear()
        callback, self._on_line = self._on_line, None
        try:
            message = json.loads(line)
        except (UnicodeDecodeError, ValueError):
            message = None
        if not isinstance(message, dict):
            self.close()
            return
        if rest:
            self._hold(rest)
        callback(message, self)

    def _hold(self, data: bytes) -> None:
        self._held += data
        if len(self._held) >= self._hold_bytes:
            self._pause("unpaired")

    def _flush(self) -> None:
        if self.peer is None or self.peer.transport is None:
            return
        held, self._held = bytes(self._held), bytearray()
        self._resume("unpaired")
        if held:
            self._forward(held)
        if self._eof:
            self.eof_received()

    def _forward(self, data: bytes) -> None:
        assert self.peer is not None and self.peer.transport is not None
        self.peer.transport.write(data)
        delay = self.pace.debit(len(data))
        if delay > 0:
            self._pause("pace")
            asyncio.get_running_loop().call_later(delay, self._resume, "pace")

    def _pause(self, why: str) -> None:
        if not self._pauses and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._pauses.add(why)

    def _resume(self, why: str) -> None:
        if why not in self._pauses or self._splice is not None:
            return
        self._pauses.discard(why)
        if not self._pauses and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
