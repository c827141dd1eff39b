"""``DhtConfig``: how a daemon joins (or starts) the DHT, checked field by field before anything starts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr
from hivemind.utils.multiaddr.exceptions import Error as MultiaddrError

from gossamer.transport.dht.storage import StorageLimits

PEER_MADDR_FORM = "/ip4/HOST/tcp/PORT/p2p/PEERID"


@dataclass(frozen=True, kw_only=True)
class DhtConfig:
    """How a daemon joins (or starts) the DHT.

    Attributes:
        initial_peers: full multiaddrs (``/ip4/HOST/tcp/PORT/p2p/PEERID``) of running peers to join.
        host_maddrs: multiaddrs to listen on; ``/tcp/0`` picks a free port.
        announce_maddrs: public multiaddrs to advertise instead (behind NAT); explicit ports only.
        new_swarm: start a new network (then ``initial_peers`` must be empty).
        client_mode: only make requests, never serve or store for others (for unreachable hosts).
        bootstrap_timeout_s: time allowed for p2pd to start and the initial peers to answer.
        request_timeout_s: deadline of one whole store / get_all / withdraw; each hivemind RPC gets
            a third of it, so one silent peer cannot use up the whole deadline.
        max_value_bytes: largest payload stored or returned.
        max_lifetime_s: longest an entry may live (its signed expiration minus its signing time);
            the layer above caps its own keys tighter with key rules.
        max_clock_skew_s: how far in the future an entry may be signed (clocks differ).
        storage: what this node stores for others, at most (``storage.StorageLimits``).
    """

    initial_peers: tuple[str, ...] = ()
    host_maddrs: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    announce_maddrs: tuple[str, ...] = ()
    new_swarm: bool = False
    client_mode: bool = False
    bootstrap_timeout_s: float = 15.0
    request_timeout_s: float = 5.0
    max_value_bytes: int = 64 * 1024
    max_lifetime_s: float = 3600.0
    max_clock_skew_s: float = 30.0
    storage: StorageLimits = field(default_factory=StorageLimits)

    def __post_init__(self) -> None:
        check_maddrs("initial_peers", self.initial_peers, PEER_MADDR_FORM)
        check_maddrs("host_maddrs", self.host_maddrs, "/ip4/HOST/tcp/PORT")
        check_maddrs("announce_maddrs", self.announce_maddrs, "/ip4/HOST/tcp/PORT")
        if not self.host_maddrs:
            raise ValueError("host_maddrs: give at least one address to listen on, e.g. /ip4/0.0.0.0/tcp/0")
        for text in self.initial_peers:
            if "p2p" not in Multiaddr(text):
                raise ValueError(f"initial_peers: {text!r} lacks the /p2p/PEERID part; copy the full "
                                 f"multiaddr the first peer printed ({PEER_MADDR_FORM})")
        for text in self.announce_maddrs:
            if tcp_port(Multiaddr(text)) == 0:
                raise ValueError(f"announce_maddrs: {text!r} has port 0; announce an explicit port")
        if self.new_swarm and self.initial_peers:
            raise ValueError("initial_peers: must be empty with new_swarm=True; pass --new_swarm to start "
                             "a new network, or --initial_peers to join one")
        if not self.new_swarm and not self.initial_peers:
            raise ValueError("initial_peers: empty; pass --new_swarm to start a new network, "
                             "or --initial_peers to join one")
        for name in ("bootstrap_timeout_s", "request_timeout_s", "max_value_bytes", "max_lifetime_s",
                     "max_clock_skew_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"{name}: must be a positive finite number, got {value!r}")
        if not isinstance(self.storage, StorageLimits):
            raise ValueError(f"storage: must be a StorageLimits, got {type(self.storage).__name__}")


def check_maddrs(field: str, values: tuple[str, ...], form: str) -> None:
    if not isinstance(values, tuple):
        raise ValueError(f"{field}: must be a tuple of multiaddr strings, got {type(values).__name__}")
    for text in values:
        try:
            maddr = Multiaddr(text)
            if "p2p" in maddr:
                PeerID.from_base58(maddr["p2p"])
        except (MultiaddrError, TypeError, ValueError) as exc:
            raise ValueError(f"{field}: {text!r} is not a valid multiaddr; expected {form}") from exc


def tcp_port(maddr: Multiaddr) -> int | None:
    return int(maddr["tcp"]) if "tcp" in maddr else None
