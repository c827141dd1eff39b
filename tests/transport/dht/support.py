"""What the DHT tests share: fast timeouts, a made-up peer id, p2pd children of this process."""

from __future__ import annotations

import os
import socket

from gossamer.transport.dht.config import DhtConfig
from gossamer.transport.dht.membership import DhtMembership

KEY = "run/demo@ab12cd34/peers"
MADE_UP_PEER_ID = "QmXfptdHU6hqG95JswxYVUH4bphcK8y18mhFcgUQFe6fCN"
# Bounds on waits that succeed at once on an idle machine; they only decide how long a busy one may take.
FAST = {"bootstrap_timeout_s": 30.0, "request_timeout_s": 10.0}


def p2pd_children() -> set[int]:
    """Pids of processes whose parent is this test process and whose command is p2pd."""
    pids = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                stat = stat_file.read()
        except (FileNotFoundError, ProcessLookupError):  # the process just exited
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        if comm == "p2pd" and parent == os.getpid():
            pids.add(int(entry))
    return pids


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def join(first: DhtMembership, **overrides: object) -> DhtMembership:
    return await DhtMembership.create(DhtConfig(initial_peers=tuple(first.visible_maddrs()), **FAST, **overrides))
