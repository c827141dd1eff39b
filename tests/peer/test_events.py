"""The daemon's event sink: a reader that falls behind never blocks the emitting (event-loop)
thread; lines keep their order, and what a full queue drops is counted and said."""

from __future__ import annotations

import json
import os
import threading

import pytest

from gossamer.peer.events import EventSink

pytestmark = pytest.mark.timeout(60)


def pipe_sink(max_queued: int) -> tuple[EventSink, int]:
    read_fd, write_fd = os.pipe()
    stream = os.fdopen(write_fd, "w", encoding="utf-8")
    return EventSink(enabled=True, stream=stream, buffered=True, max_queued=max_queued), read_fd


def read_lines(read_fd: int, count: int) -> list[dict]:
    """``count`` JSON lines from the pipe (blocking reads, as a slow reader finally catching up)."""
    buffer, lines = b"", []
    while len(lines) < count:
        chunk = os.read(read_fd, 65536)
        assert chunk, f"the pipe closed after {len(lines)} of {count} lines"
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        lines += [json.loads(line) for line in complete]
    return lines


def test_emitting_more_than_a_pipe_holds_does_not_wait_for_the_reader() -> None:
    sink, read_fd = pipe_sink(max_queued=10_000)
    padding = "x" * 1000
    for i in range(2000):  # ~2 MB, 30x what the pipe holds: a synchronous write would block here for good
        sink.emit("test.tick", i=i, padding=padding)
    assert sink.dropped == 0
    got: list[dict] = []
    reader = threading.Thread(target=lambda: got.extend(read_lines(read_fd, 2000)))
    reader.start()
    sink.close()
    reader.join(30)
    assert [e["i"] for e in got] == list(range(2000)) and all(e["event"] == "test.tick" for e in got)
    os.close(read_fd)


def test_a_full_queue_drops_and_counts_and_says_so() -> None:
    sink, read_fd = pipe_sink(max_queued=5)
    padding = "x" * 20_000  # 200 of these are 4 MB: more than any pipe buffer plus a queue of 5
    for i in range(200):
        sink.emit("test.tick", i=i, padding=padding)
    dropped = sink.dropped
    assert dropped > 0
    got: list[dict] = []
    reader = threading.Thread(target=lambda: got.extend(read_all(read_fd)))
    reader.start()
    sink.close()
    sink._stream.close()  # type: ignore[union-attr]  # EOF for the reader
    reader.join(30)
    ticks = [e["i"] for e in got if e["event"] == "test.tick"]
    assert ticks == sorted(ticks) and len(ticks) == 200 - dropped  # in order; the gaps are the dropped ones
    assert sum(e["count"] for e in got if e["event"] == "events_dropped") == dropped, got[-3:]
    os.close(read_fd)


def read_all(read_fd: int) -> list[dict]:
    data = b""
    while chunk := os.read(read_fd, 65536):
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_an_unbuffered_sink_writes_at_once() -> None:
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "w", encoding="utf-8") as stream:
        EventSink(enabled=True, stream=stream).emit("test.now", value=1)
    assert read_lines(read_fd, 1) == [{"event": "test.now", "value": 1}]
    os.close(read_fd)


def test_flush_returns_once_every_earlier_line_is_written() -> None:
    read_fd, write_fd = os.pipe()
    stream = os.fdopen(write_fd, "w", encoding="utf-8")
    sink = EventSink(enabled=True, stream=stream, buffered=True)
    for i in range(5):
        sink.emit("test.tick", i=i)
    assert sink.flush()
    os.set_blocking(read_fd, False)  # everything must already be in the pipe: a read that waits would fail here
    assert [json.loads(line)["i"] for line in os.read(read_fd, 65536).splitlines()] == list(range(5))
    sink.close()
    stream.close()
    os.close(read_fd)


def test_flush_gives_up_on_a_reader_that_stopped_reading() -> None:
    sink, read_fd = pipe_sink(max_queued=10)
    padding = "x" * 100_000
    for i in range(3):  # 300 kB: more than the pipe holds, and nobody reads
        sink.emit("test.tick", i=i, padding=padding)
    assert not sink.flush(timeout_s=0.5)
    os.close(read_fd)  # the writer's next write fails; close does not wait for it
    sink.close(timeout_s=0.5)
