"""One direction of one emulated WAN connection (``wan``): the link profile (``LinkProfile``), the
token bucket that charges its bandwidth, possibly shared by a peer's connections (``AccessLink``),
and the pipe that applies it (``Pipe``: due times absolute, so late timers never slow the link)."""

from __future__ import annotations

import asyncio
import collections
import math
import random
import socket
from dataclasses import dataclass

MIN_BURST_BYTES = 64 * 1024
BURST_WINDOW_S = 0.005
MAX_CHUNK_BYTES = 256 * 1024
UNLIMITED_QUEUE_BYTES = 8 * 1024 * 1024
MIN_QUEUE_BYTES = 1024 * 1024


def _check_number(owner: str, name: str, value: object, *, low: float, high: float = math.inf,
                  low_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and value <= high
    if not ok:
        bound = f"{'>' if low_open else '>='} {low}" + (f" and <= {high}" if high < math.inf else "")
        raise ValueError(f"{owner}.{name} must be a finite number {bound}, got {value!r}")


def _check_int(owner: str, name: str, value: object, *, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{owner}.{name} must be an int >= {low}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class LinkProfile:
    """How one direction of an emulated link behaves.

    Attributes:
        latency_s: one-way propagation delay added to every chunk.
        jitter_s: extra delay per chunk, uniform in [0, jitter_s); order is preserved (a chunk is
            never due before the one ahead of it), as TCP never reorders.
        rate_bytes_per_s: bandwidth cap (token bucket), None for unlimited. The bucket holds
            ``burst_bytes`` = max(64 KiB, 5 ms of rate), so an idle link sends that much at once.
        drop_probability: per forwarded chunk, the chance it is "lost". A TCP application does not
            see loss, it sees a stall: the chunk and everything behind it arrives
            ``retransmit_delay_s`` late (head-of-line blocking until the retransmission).
        retransmit_delay_s: the stall a drop causes (~ a retransmission timeout).
        reset_probability: per connection, the chance this direction resets the connection (both
            sides aborted with SO_LINGER 0, so each endpoint sees a reset) once a number of bytes,
            uniform in [0, reset_window_bytes), has been forwarded this way.
        reset_window_bytes: upper end (exclusive) of that random byte count.
        reset_after_bytes: deterministic reset after exactly this many bytes (for tests);
            exclusive with ``reset_probability``.
        refuse_probability: per new connection, the chance it is closed at once (reset) without
            reaching the target. The proxy reads it from its ``up`` profile.
        slice_bytes: forward in writes of at most this many bytes, each sent on its own (1: the
            receiver sees its frames a byte at a time; ``Pipe``); None: a chunk per write.
        seed: seed of the ``random.Random`` the proxy owns for this direction (None: from the OS).
    """

    latency_s: float = 0.0
    jitter_s: float = 0.0
    rate_bytes_per_s: float | None = None
    drop_probability: float = 0.0
    retransmit_delay_s: float = 0.2
    reset_probability: float = 0.0
    reset_window_bytes: int = 1 << 20
    reset_after_bytes: int | None = None
    refuse_probability: float = 0.0
    slice_bytes: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("latency_s", "jitter_s", "retransmit_delay_s"):
            _check_number("LinkProfile", name, getattr(self, name), low=0.0)
        for name in ("drop_probability", "reset_probability", "refuse_probability"):
            _check_number("LinkProfile", name, getattr(self, name), low=0.0, high=1.0)
        if self.rate_bytes_per_s is not None:
            _check_number("LinkProfile", "rate_bytes_per_s", self.rate_bytes_per_s, low=0.0, low_open=True)
        _check_int("LinkProfile", "reset_window_bytes", self.reset_window_bytes, low=1)
        if self.reset_after_bytes is not None:
            _check_int("LinkProfile", "reset_after_bytes", self.reset_after_bytes, low=0)
            if self.reset_probability > 0:
                raise ValueError("LinkProfile.reset_after_bytes and LinkProfile.reset_probability are exclusive")
        if self.slice_bytes is not None:
            _check_int("LinkProfile", "slice_bytes", self.slice_bytes, low=1)
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"LinkProfile.seed must be an int or None, got {self.seed!r}")

    @classmethod
    def from_mbit(cls, mbit_per_s: float, latency_ms: float, **fields: object) -> LinkProfile:
        """A profile of ``mbit_per_s`` megabits per second and ``latency_ms`` one-way latency."""
        _check_number("LinkProfile.from_mbit", "mbit_per_s", mbit_per_s, low=0.0, low_open=True)
        _check_number("LinkProfile.from_mbit", "latency_ms", latency_ms, low=0.0)
        return cls(rate_bytes_per_s=mbit_per_s * 1e6 / 8, latency_s=latency_ms / 1e3, **fields)  # type: ignore[arg-type]

    @property
    def burst_bytes(self) -> int | None:
        """Token-bucket depth: max(64 KiB, 5 ms of rate); None when the rate is unlimited."""
        if self.rate_bytes_per_s is None:
            return None
        return max(MIN_BURST_BYTES, math.ceil(self.rate_bytes_per_s * BURST_WINDOW_S))

    @property
    def chunk_bytes(self) -> int:
        """Largest chunk the proxy receives at once on this link."""
        burst = self.burst_bytes
        return MAX_CHUNK_BYTES if burst is None else min(MAX_CHUNK_BYTES, burst)

    def default_queue_bytes(self) -> int:
        """Queue bound: twice what is in flight (rate x delay) plus two chunks, at least 1 MiB."""
        if self.rate_bytes_per_s is None:
            return UNLIMITED_QUEUE_BYTES
        delay_s = self.latency_s + self.jitter_s + (self.retransmit_delay_s if self.drop_probability else 0.0)
        return max(MIN_QUEUE_BYTES, math.ceil(2 * self.rate_bytes_per_s * delay_s) + 2 * self.chunk_bytes)


class TokenBucket:
    """A token bucket that may go into debt: ``reserve`` says when n bytes finish serialising."""

    def __init__(self, rate_bytes_per_s: float, burst_bytes: int, now: float) -> None:
        self._rate = rate_bytes_per_s
        self._burst = burst_bytes
        self._tokens = float(burst_bytes)
        self._last = now
        self.charged_bytes = 0

    def reserve(self, size_bytes: int, now: float) -> float:
        """Charge ``size_bytes`` at ``now``; return the time the bucket is out of debt again."""
        self.charged_bytes += size_bytes
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate) - size_bytes
        self._last = now
        return now if self._tokens >= 0 else now - self._tokens / self._rate


class AccessLink:
    """One peer's access link, shared: every connection of every proxy handed it (the proxies in
    front of one peer's ports) charges one token bucket per direction, so together they get the
    link's rate instead of the rate each (a mesh of pair links gives a peer with k neighbours k
    times its bandwidth). ``inbound`` paces what crosses a proxy towards its target (the proxy's
    ``up``), ``outbound`` what comes back (``down``); latency, jitter, drops and resets stay per
    connection, from the proxy's profiles. Buckets start at the first connection."""

    def __init__(self, rate_bytes_per_s: float, *, burst_bytes: int | None = None) -> None:
        _check_number("AccessLink", "rate_bytes_per_s", rate_bytes_per_s, low=0.0, low_open=True)
        if burst_bytes is not None:
            _check_int("AccessLink", "burst_bytes", burst_bytes, low=1)
        self.rate_bytes_per_s = float(rate_bytes_per_s)
        self.burst_bytes = burst_bytes or max(MIN_BURST_BYTES, math.ceil(rate_bytes_per_s * BURST_WINDOW_S))
        self._buckets: dict[str, TokenBucket] = {}

    @classmethod
    def from_mbit(cls, mbit_per_s: float) -> AccessLink:
        _check_number("AccessLink", "mbit_per_s", mbit_per_s, low=0.0, low_open=True)
        return cls(mbit_per_s * 1e6 / 8)

    def charged_bytes(self, direction: str) -> int:
        """Bytes charged to ``direction`` so far, over every connection sharing the link."""
        bucket = self._buckets.get(direction)
        return 0 if bucket is None else bucket.charged_bytes

    def bucket(self, direction: str, now: float) -> TokenBucket:
        """The shared bucket of ``direction`` ("inbound" or "outbound")."""
        if direction not in ("inbound", "outbound"):
            raise ValueError(f"AccessLink direction must be 'inbound' or 'outbound', got {direction!r}")
        if direction not in self._buckets:
            self._buckets[direction] = TokenBucket(self.rate_bytes_per_s, self.burst_bytes, now)
        return self._buckets[direction]


Chunk = tuple[float, bytes | None]  # (due time, data); data None marks EOF


class ChunkQueue:
    """Single-producer single-consumer queue bounded in bytes and in chunks.

    A chunk larger than ``max_bytes`` is still accepted into an empty queue, so nothing deadlocks.
    """

    def __init__(self, *, max_bytes: int, max_chunks: int) -> None:
        self._items: collections.deque[Chunk] = collections.deque()
        self._bytes = 0
        self._max_bytes = max_bytes
        self._max_chunks = max_chunks
        self._not_empty = asyncio.Event()
        self._not_full = asyncio.Event()

    def _full(self, size_bytes: int) -> bool:
        if not self._items:
            return False
        return len(self._items) >= self._max_chunks or self._bytes + size_bytes > self._max_bytes

    async def put(self, chunk: Chunk) -> None:
        size = 0 if chunk[1] is None else len(chunk[1])
        while self._full(size):
            self._not_full.clear()
            await self._not_full.wait()
        self._items.append(chunk)
        self._bytes += size
        self._not_empty.set()

    async def get(self) -> Chunk:
        while not self._items:
            self._not_empty.clear()
            await self._not_empty.wait()
        chunk = self._items.popleft()
        self._bytes -= 0 if chunk[1] is None else len(chunk[1])
        self._not_full.set()
        return chunk


@dataclass
class DirectionCounters:
    """Mutable per-direction counters, owned by the proxy and shared by its pipes."""

    bytes_forwarded: int = 0
    chunks_forwarded: int = 0
    chunks_dropped: int = 0
    writes: int = 0


class InjectedReset(Exception):
    """Raised inside a pipe when its profile says the connection must be reset now."""


class Pipe:
    """Moves bytes from ``src`` to ``dst`` through one ``LinkProfile``: one direction of one
    emulated WAN connection.

    A pipe is a reader task and a writer task joined by a queue bounded in bytes and in chunks:

    - the reader receives a chunk (up to ``chunk_bytes``) from its source socket, charges it to a
      token bucket (the serialisation delay), stamps it with its due time = end of serialisation +
      latency + jitter (+ ``retransmit_delay_s`` if the chunk is "dropped"), never earlier than the
      previous chunk's due time, queues it, and sleeps until the bucket is out of debt before the next
      receive (so the proxy holds what is in flight on the link, not a backlog);
    - the writer sleeps until each chunk's due time and sends it to the destination socket: in one
      call, or with ``slice_bytes`` set, in slices of at most that many bytes (memoryviews of the
      chunk, nothing copied), each its own ``sock_sendall`` followed by a pass of the event loop.

    Due times are absolute (``loop.time()``), so a timer that fires late does not slow the link
    down: the queue holds a bandwidth-delay product in flight and throughput reaches the rate.

    Slicing changes how bytes arrive, not when a chunk is due or how the bandwidth is charged (the
    reader charges whole chunks as before): the proxy's sockets have TCP_NODELAY, so every slice
    leaves as its own segment and the receiving endpoint reads its frames a slice at a time, the way
    a peer behind a tiny MSS or a dripping middlebox would deliver them. A slice costs a syscall and
    a pass of the loop, so 1-byte slices carry about 100 kB/s per direction (measured on a busy
    2-core machine): the link then runs at the lower of that and its rate, and the bounded queue pushes back
    on the sender as always. ``DirectionCounters.writes`` counts the sends.
    """

    def __init__(self, src: socket.socket, dst: socket.socket, profile: LinkProfile, *,
                 rng: random.Random, counters: DirectionCounters, queue_bytes: int, queue_chunks: int,
                 bucket: TokenBucket | None = None) -> None:
        """``bucket``: a shared one (an ``AccessLink``'s) instead of this pipe's own from ``profile``."""
        self._loop = asyncio.get_running_loop()
        self._src, self._dst, self._profile = src, dst, profile
        self._rng, self._counters = rng, counters
        self._queue = ChunkQueue(max_bytes=queue_bytes, max_chunks=queue_chunks)
        rate, burst = profile.rate_bytes_per_s, profile.burst_bytes
        if bucket is None and rate is not None and burst is not None:
            bucket = TokenBucket(rate, burst, self._loop.time())
        self._bucket = bucket
        self._last_due = 0.0
        self._forwarded_bytes = 0
        self._reset_at = self._draw_reset_point()

    def _draw_reset_point(self) -> int | None:
        profile = self._profile
        if profile.reset_after_bytes is not None:
            return profile.reset_after_bytes
        if profile.reset_probability > 0 and self._rng.random() < profile.reset_probability:
            return self._rng.randrange(profile.reset_window_bytes)
        return None

    def _stamp(self, sent_s: float) -> float:
        profile = self._profile
        due = sent_s + profile.latency_s
        if profile.jitter_s > 0:
            due += self._rng.uniform(0.0, profile.jitter_s)
        if profile.drop_probability > 0 and self._rng.random() < profile.drop_probability:
            due += profile.retransmit_delay_s
            self._counters.chunks_dropped += 1
        self._last_due = max(self._last_due, due)
        return self._last_due

    async def read_loop(self) -> None:
        """Receive, pace, stamp and queue chunks until EOF (queued as a chunk with data None)."""
        buffer = bytearray(self._profile.chunk_bytes)
        view = memoryview(buffer)
        while True:
            size = await self._loop.sock_recv_into(self._src, buffer)
            now = self._loop.time()
            if size == 0:
                self._last_due = max(self._last_due, now + self._profile.latency_s)
                await self._queue.put((self._last_due, None))
                return
            sent_s = now if self._bucket is None else self._bucket.reserve(size, now)
            await self._queue.put((self._stamp(sent_s), bytes(view[:size])))
            if sent_s > self._loop.time():
                await asyncio.sleep(sent_s - self._loop.time())

    async def write_loop(self) -> None:
        """Send each chunk at its due time; forward EOF as shutdown(SHUT_WR)."""
        while True:
            due, data = await self._queue.get()
            delay_s = due - self._loop.time()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            if data is None:
                self._dst.shutdown(socket.SHUT_WR)
                return
            await self._send(data)

    async def _send(self, data: bytes) -> None:
        left = None if self._reset_at is None else self._reset_at - self._forwarded_bytes
        await self._write(memoryview(data)[:left])
        self._counters.chunks_forwarded += 1
        if left is not None and len(data) >= left:
            raise InjectedReset(f"reset after {self._reset_at} bytes")

    async def _write(self, view: memoryview) -> None:
        """Send ``view`` in one call, or in ``slice_bytes`` slices with a pass of the event loop
        between them (so a receiver on this loop reads each before the next goes out)."""
        step = self._profile.slice_bytes or max(len(view), 1)
        for start in range(0, len(view), step):
            if start:
                await asyncio.sleep(0)
            piece = view[start:start + step]
            await self._loop.sock_sendall(self._dst, piece)
            self._forwarded_bytes += len(piece)
            self._counters.bytes_forwarded += len(piece)
            self._counters.writes += 1
