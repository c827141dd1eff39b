"""Prometheus metrics of one daemon, in a registry of its own (no process-global state).

Values are read from the daemon's live objects at scrape time by a custom collector, so nothing
has to remember to bump a counter: bytes come from the transports' own counters, peers from the
peer view, progress from the roles.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Traffic:
    """Bytes moved by one transport, per message type where the transport knows it."""

    sent: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)

    def add_sent(self, kind: str, size_bytes: int) -> None:
        self.sent[kind] = self.sent.get(kind, 0) + size_bytes

    def add_received(self, kind: str, size_bytes: int) -> None:
        self.received[kind] = self.received.get(kind, 0) + size_bytes


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """What the collector reads on each scrape (a callable returns a fresh one)."""

    uptime_s: float
    live_peers: int
    round: int
    bytes_sent: dict[str, int]
    bytes_received: dict[str, int]
    records_rejected: dict[str, int]
    dht_store_failures: dict[str, int] = field(default_factory=dict)
    dht_refused: dict[str, int] = field(default_factory=dict)
    dht_rejoined: int = 0
    extra_gauges: dict[str, float] = field(default_factory=dict)


class _DaemonCollector(Collector):
    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        yield GaugeMetricFamily("gossamer_uptime_seconds", "Seconds since the daemon started", value=snap.uptime_s)
        yield GaugeMetricFamily("gossamer_live_peers", "Admitted peers with an unexpired record", value=snap.live_peers)
        yield GaugeMetricFamily("gossamer_round", "Round this peer is at", value=snap.round)
        for name, doc, values in (("gossamer_bytes_sent", "Bytes sent", snap.bytes_sent),
                                  ("gossamer_bytes_received", "Bytes received", snap.bytes_received)):
            family = CounterMetricFamily(name, doc, labels=["kind"])
            for kind, value in sorted(values.items()):
                family.add_metric([kind], value)
            yield family
        for name, doc, label, values in (
                ("gossamer_records_rejected", "Peer records refused", "reason", snap.records_rejected),
                ("gossamer_dht_store_failures", "Stores of this peer's DHT entries no node took", "entry",
                 snap.dht_store_failures),
                ("gossamer_dht_refused", "DHT records this node refused to store or believe", "reason",
                 snap.dht_refused)):
            family = CounterMetricFamily(name, doc, labels=[label])
            for key, value in sorted(values.items()):
                family.add_metric([key], value)
            yield family
        yield CounterMetricFamily("gossamer_dht_rejoined", "Times this node lost every DHT peer and joined again",
                                  value=snap.dht_rejoined)
        for name, value in sorted(snap.extra_gauges.items()):
            yield GaugeMetricFamily(f"gossamer_{name}", f"Role metric {name}", value=value)


class PeerMetrics:
    """Two registries with the daemon's collector; ``render(owner=...)`` gives the Prometheus text
    format of the owner's view or the public one (``snapshot(owner)`` decides what each holds)."""

    def __init__(self, snapshot: Callable[[bool], Snapshot]) -> None:
        self._registries = {}
        for owner in (True, False):
            registry = CollectorRegistry(auto_describe=False)
            registry.register(_DaemonCollector(functools.partial(snapshot, owner)))
            self._registries[owner] = registry

    def render(self, *, owner: bool = True) -> bytes:
        return generate_latest(self._registries[owner])


def merge_counts(*parts: dict[str, Any]) -> dict[str, int]:
    """Sum several {kind: bytes} maps."""
    total: dict[str, int] = {}
    for part in parts:
        for kind, value in part.items():
            total[kind] = total.get(kind, 0) + int(value)
    return total


def process_usage() -> dict[str, int]:
    """What a long run must keep flat: asyncio tasks, open file descriptors, resident memory and
    threads of this process (Linux's /proc; -1 where it cannot be read)."""
    usage = {"asyncio_tasks": len(asyncio.all_tasks()), "threads": threading.active_count()}
    try:
        usage["open_fds"] = len(os.listdir("/proc/self/fd"))
    except OSError:
        usage["open_fds"] = -1
    usage["rss_bytes"] = -1
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    usage["rss_bytes"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return usage
