"""``gossamer status``: join the DHT as a client, verify the run's records, print the live peers."""

from __future__ import annotations

import asyncio
import json

from gossamer.peer.config import PeerConfig
from gossamer.peer.plugin import PluginRegistry
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.joining import fetch_manifest, start_membership
from gossamer.peer.run.keys import peers_key
from gossamer.peer.run.records import peer_row
from gossamer.peer.run.view import PeerView

COLUMNS = (("peer_id", "PEER ID", 14), ("name", "NAME", 14), ("roles", "ROLES", 22), ("round", "ROUND", 6),
           ("http_addr", "ADDRESS", 22), ("reachability", "REACH", 8), ("last_seen_s", "LAST SEEN", 9))


def run_status(*, run: str, initial_peers: tuple[str, ...], timeout_s: float, as_json: bool,
               plugins: PluginRegistry) -> int:
    protocol, records = asyncio.run(live_records(run=run, initial_peers=initial_peers, timeout_s=timeout_s))
    rows = [peer_row(record, now) for record, now in records]
    summary = _summary(plugins, protocol, [record for record, _now in records])
    if as_json:
        print(json.dumps({"run_id": run, "protocol": protocol, "peers": rows, "summary": summary}, indent=2))
    else:
        print(f"run {run} ({protocol}): {len(rows)} live peer(s)")
        print(format_table(rows))
        for line in summary:
            print(line)
    return 0


def _summary(plugins: PluginRegistry, protocol: str, records: list) -> list[str]:
    """What the run's protocol says about its live peers (nothing for a protocol this build lacks)."""
    if protocol not in plugins.protocols:
        return [f"(protocol {protocol!r} is not one this version of gossamer knows)"]
    return plugins.plugin(protocol).summarize(records)


async def live_records(*, run: str, initial_peers: tuple[str, ...], timeout_s: float) -> tuple[str, list]:
    """The run's protocol and its live peers' verified records, each with the DHT time it was read at."""
    config = PeerConfig(run=run, initial_peers=initial_peers, host_maddrs=("/ip4/127.0.0.1/tcp/0",),
                        join_timeout_s=timeout_s, identity_path=PeerConfig().identity_path)
    membership = await start_membership(config)
    try:
        manifest = await fetch_manifest(membership, config)
        view = PeerView(Admission(manifest), ttl_s=manifest.ttl_s)
        view.update(await membership.get_all(peers_key(run)), now=membership.now())
        now = membership.now()
        return manifest.config.protocol, [(p.record, now) for p in view.live(now=now)]
    finally:
        await membership.aclose()


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table of peer rows."""
    lines = ["  ".join(title.ljust(width) for _key, title, width in COLUMNS)]
    for row in rows:
        cells = []
        for key, _title, width in COLUMNS:
            value = row.get(key, "")
            if isinstance(value, list):
                text = ",".join(value) or "-"
            elif key == "last_seen_s" and isinstance(value, int | float):
                text = f"{value:.1f}s"
            elif key == "peer_id":
                text = str(value)[:12]
            else:
                text = str(value) or "-"
            cells.append((text[: width - 1] + "…" if len(text) > width else text).ljust(width))
        lines.append("  ".join(cells))
    return "\n".join(lines)

