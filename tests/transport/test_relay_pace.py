"""The per-peer bandwidth cap of a relay (``wire.Pace``, ``RelayConfig.rate_bytes_per_s``), checked
on its decisions, never on elapsed time: with a clock the test drives, a mover that honours every
pause the pace asks for moves exactly ``burst + rate * t`` bytes by time ``t``, and in any window
of ``w`` seconds no more than ``burst + rate * w`` plus one chunk per mover; through a real relay,
the decisions the relay's pace took over a transfer (its own clock, the bytes it had counted) keep
the same bound (``tests/transport/test_relay.py``)."""

from __future__ import annotations

import math
import random

import pytest

from gossamer.transport.relay.wire import CHUNK_BYTES, Pace

RATE = 10e6
BURST = 4 * CHUNK_BYTES


class Clock:
    """Seconds that move only when the test moves them."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def chunks(total_bytes: int, seed: int) -> list[int]:
    """Chunk sizes as a socket hands them over: anything from 1 byte to ``CHUNK_BYTES``."""
    rng, sizes = random.Random(seed), []
    while sum(sizes) < total_bytes:
        sizes.append(rng.choice([1, 1460, 65536, CHUNK_BYTES, rng.randint(1, CHUNK_BYTES)]))
    return sizes


def move(pace: Pace, clock: Clock, sizes: list[int]) -> list[tuple[float, int]]:
    """A mover that moves at once and pauses as told (as ``wire.Pipe`` does); (time, bytes counted)
    at each decision."""
    decisions = []
    for size in sizes:
        delay = pace.debit(size)
        decisions.append((clock.t, pace.moved))
        clock.t += delay
    return decisions


def worst_window_excess(decisions: list[tuple[float, int]], rate: float, burst: float) -> float:
    """The most bytes any window between two decisions let through beyond ``burst + rate * w``."""
    worst = -math.inf
    for i, (t_i, moved_i) in enumerate(decisions):
        for t_j, moved_j in decisions[i + 1:]:
            worst = max(worst, (moved_j - moved_i) - (burst + rate * (t_j - t_i)))
    return worst


def test_a_transfer_takes_exactly_its_bytes_over_the_rate_beyond_the_burst() -> None:
    clock = Clock()
    pace = Pace(RATE, burst_bytes=BURST, clock=clock)
    sizes = chunks(64 << 20, seed=1)
    decisions = move(pace, clock, sizes)
    assert pace.moved == sum(sizes)
    assert math.isclose(clock.t, (sum(sizes) - BURST) / RATE, rel_tol=1e-9)  # so its mean rate is the cap
    assert worst_window_excess(decisions[::4], RATE, BURST) <= max(sizes)  # one mover: its last chunk over


def test_idle_time_banks_no_more_than_the_burst() -> None:
    clock = Clock()
    pace = Pace(RATE, burst_bytes=BURST, clock=clock)
    move(pace, clock, chunks(8 << 20, seed=2))
    clock.t += 3600.0
    start, sizes = clock.t, chunks(16 << 20, seed=3)
    move(pace, clock, sizes)
    assert math.isclose(clock.t - start, (sum(sizes) - BURST) / RATE, rel_tol=1e-9)


def test_movers_sharing_a_pace_share_the_rate() -> None:
    clock = Clock()
    pace = Pace(RATE, burst_bytes=BURST, clock=clock)
    queues = [chunks(24 << 20, seed=4), chunks(12 << 20, seed=5), chunks(6 << 20, seed=6)]
    ready = [0.0] * len(queues)  # when each mover's pause ends
    decisions = []
    while any(queues):
        mover = min((i for i, q in enumerate(queues) if q), key=lambda i: ready[i])
        clock.t = max(clock.t, ready[mover])
        delay = pace.debit(queues[mover].pop(0))
        decisions.append((clock.t, pace.moved))
        ready[mover] = clock.t + delay
    assert worst_window_excess(decisions[::8], RATE, BURST) <= len(queues) * CHUNK_BYTES
    assert clock.t >= (pace.moved - BURST - len(queues) * CHUNK_BYTES) / RATE


def test_no_cap_never_pauses_and_still_counts() -> None:
    clock = Clock()
    pace = Pace(0, clock=clock)
    assert all(d == 0.0 for d in (pace.debit(n) for n in chunks(32 << 20, seed=7)))
    assert pace.moved >= 32 << 20
    with pytest.raises(ValueError, match="rate_bytes_per_s"):
        Pace(-1.0)
