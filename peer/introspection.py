"""What a running daemon says about itself: its overall state (``/healthz``, the CLI's exit),
``/status`` (full for its owner, without the roles' private fields for anyone else), the
``/metrics`` snapshot, the command that joins its run, and one row per live peer."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gossamer import __version__
from gossamer.peer.metrics import Snapshot, merge_counts, process_usage
from gossamer.peer.role import FAILED, RUNNING, SERVING
from gossamer.peer.run.records import PeerRecord

if TYPE_CHECKING:
    from gossamer.peer.daemon import Daemon

VERSION = __version__


class Introspection:
    """The self-describing half of ``Daemon`` (see the module docstring)."""

    @property
    def round(self: Daemon) -> int:
        return max((role.round for role in self.roles), default=0)

    def state(self: Daemon) -> dict[str, Any]:
        """How this peer is doing: ``failed`` (a role failed), ``running`` (a role is working
        towards its end, or the peer only serves), ``idle`` (its roles with an end are finished
        and the others serve on) or ``finished`` (every role is finished); and each role's health."""
        health = {role.name: role.health() for role in self.roles}
        states = {h.state for h in health.values()}
        if FAILED in states:
            overall = "failed"
        elif RUNNING in states or not states or states == {SERVING}:
            overall = "running"
        else:
            overall = "idle" if SERVING in states else "finished"
        return {"state": overall, "roles": {name: h.to_json() for name, h in health.items()}}

    def join_command(self: Daemon) -> str:
        """The command line that joins this run, with this peer as the bootstrap."""
        roles = ",".join(self.plugin.swarm_roles)
        return (f"gossamer peer --run {self.manifest.run_id} --initial_peers {' '.join(self.membership.visible_maddrs())}"
                + (f" --roles {roles}" if roles else ""))

    def status(self: Daemon, *, owner: bool = True) -> dict[str, Any]:
        """What ``/status`` shows; for anyone but the ``owner`` (this host, the status token's
        holder) without the fields the roles mark private (``Role.private_status``), whose names
        are listed under ``withheld``."""
        now = self.membership.now()
        record = self.record()
        sent, received = self._bytes()
        live = self.view.live(now=now)
        panel = self.plugin.panel([p.record for p in live])
        return {
            "peer_id": self.identity.peer_id, "name": self.config.public_name, "version": VERSION,
            "run_id": self.manifest.run_id, "protocol": self.manifest.config.protocol,
            "roles": list(dict.fromkeys(self.config.roles)), "round": self.round,
            "uptime_s": round(time.monotonic() - self._started, 3), "device": self.device_info,
            "addresses": {"http": record.http_addr, "tcp": record.tcp_addr, "dht": self.membership.visible_maddrs()},
            "listening": self.listening(), "reachability": self.reach.status(),
            "bytes_sent": sum(sent.values()), "bytes_received": sum(received.values()),
            "live_peers": [peer_row(p.record, now) for p in live],
            "records_rejected": dict(self.view.rejected),
            "dht": {"stored": dict(self.store_log.stored), "store_failures": dict(self.store_log.failed),
                    "refused": dict(self.membership.refused), "rejoined": self.membership.rejoined},
            "role_status": {role.name: role.status() if owner else role.public_status() for role in self.roles},
            "withheld": {} if owner else {role.name: sorted(role.private_status) for role in self.roles
                                          if role.private_status},
            "health": self.state(), "join": self.join_command(), "summary": self.plugin.summary,
            "panels": [panel.to_json()] if panel is not None else [], "checkpoints": dict(self.checkpoints),
            "process": process_usage(),
        }

    def _status_for(self: Daemon, owner: bool) -> dict[str, Any]:
        return self.status(owner=owner)

    def _bytes(self: Daemon) -> tuple[dict[str, int], dict[str, int]]:
        sent = merge_counts(self.traffic.sent, {"tcp": self.tcp.stats.bytes_out if self.tcp else 0})
        received = merge_counts(self.traffic.received, {"tcp": self.tcp.stats.bytes_in if self.tcp else 0})
        return sent, received

    def _snapshot(self: Daemon, owner: bool = True) -> Snapshot:
        sent, received = self._bytes()
        return Snapshot(uptime_s=time.monotonic() - self._started, live_peers=len(self.view.live(now=self.membership.now())),
                        round=self.round, bytes_sent=sent, bytes_received=received,
                        records_rejected=dict(self.view.rejected),
                        dht_store_failures=dict(self.store_log.failed), dht_refused=dict(self.membership.refused),
                        dht_rejoined=self.membership.rejoined,
                        extra_gauges={**{f"process_{k}": float(v) for k, v in process_usage().items()},
                                      **{k: v for role in self.roles
                                         for k, v in (role.gauges() if owner else role.public_gauges()).items()}})


def peer_row(record: PeerRecord, now: float) -> dict[str, Any]:
    """One row of a live peer table (``/status`` and ``gossamer status``)."""
    return {"peer_id": record.peer_id, "name": record.name, "roles": list(record.roles), "round": record.round,
            "http_addr": record.http_addr, "tcp_addr": record.tcp_addr, "version": record.version,
            "reachability": record.reachability,
            "device": record.capacity.get("device_name") or record.capacity.get("device", ""),
            "assignment": dict(record.assignment), "last_seen_s": round(max(0.0, now - record.timestamp), 1)}
