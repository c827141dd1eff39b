"""Address hygiene: ``announced_host`` picks the host a peer announces for HTTP and TCP and refuses
one nobody else can use (unspecified, or loopback to a remote swarm); ``unusable_address`` and
``dht_mismatch`` say why an address fails (README.md of peer, "run.addresses")."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

from gossamer.peer.config import PeerConfig
from gossamer.peer.errors import ConfigError

UNSPECIFIED = frozenset({"0.0.0.0", "::"})


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def maddr_hosts(maddrs: Sequence[str]) -> list[str]:
    """The IP hosts of multiaddrs (``/ip4/H/...``, ``/ip6/H/...``), in order, without duplicates."""
    hosts: list[str] = []
    for text in maddrs:
        parts = text.split("/")
        if len(parts) > 2 and parts[1] in ("ip4", "ip6") and parts[2] not in hosts:
            hosts.append(parts[2])
    return hosts


def route_source(remote_host: str) -> str:
    """This host's address on the interface that routes to ``remote_host`` ("" if none does).
    Nothing is sent: connecting a UDP socket only asks the kernel for the route."""
    family = socket.AF_INET6 if ":" in remote_host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((remote_host, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return ""


def announced_host(config: PeerConfig, *, dht_maddrs: Sequence[str]) -> str:
    """The host this peer writes in its record; ConfigError when it would be unusable."""
    swarm = [h for h in maddr_hosts(config.initial_peers) if h not in UNSPECIFIED]
    remote = [h for h in swarm if not is_loopback(h)]
    host = config.configured_host
    if not host:
        if remote:
            host = route_source(remote[0]) or _first_routable(dht_maddrs)
        elif not swarm:
            host = _first_routable(dht_maddrs)
        host = host or "127.0.0.1"
    if host in UNSPECIFIED:
        raise ConfigError(f"this peer would announce {host}, which nobody can dial: pass --announce_host with "
                          "the address other peers reach this host at")
    if remote and is_loopback(host):
        raise ConfigError(f"this peer would announce the loopback address {host} to a swarm on other hosts "
                          f"({remote[0]}): pass --announce_host with this host's address that they reach "
                          f"(e.g. {route_source(remote[0]) or 'its LAN or public IP'}), or --host 0.0.0.0")
    return host


def _first_routable(maddrs: Sequence[str]) -> str:
    """The first IPv4 address, else IPv6, of ``maddrs`` that another host can dial (not loopback,
    unspecified or link-local)."""
    usable = [h for h in maddr_hosts(maddrs) if h not in UNSPECIFIED and not is_loopback(h) and not _link_local(h)]
    return next((h for h in usable if ":" not in h), usable[0] if usable else "")


def _link_local(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_link_local
    except ValueError:
        return False


def unusable_address(addr: str) -> str:
    """Why ``host:port`` cannot be dialled by another peer ("" when it can, or when ``addr`` is "":
    not served)."""
    if not addr:
        return ""
    host, sep, port = addr.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        return f"{addr!r} is not host:port"
    if host in UNSPECIFIED:
        return f"{addr!r} announces the unspecified address {host}"
    if not 0 < int(port) <= 65535:
        return f"{addr!r} announces port {port}"
    return ""


def dht_mismatch(data_host: str, dht_maddrs: Sequence[str]) -> str:
    """One line when the DHT announces hosts that do not include the data plane's ("" otherwise)."""
    dht_hosts = [h for h in maddr_hosts(dht_maddrs) if h not in UNSPECIFIED]
    if not dht_hosts or data_host in dht_hosts:
        return ""
    return (f"the DHT announces {', '.join(dht_hosts)} but the HTTP/TCP servers announce {data_host}: peers "
            f"will find this one and fail to reach it (or the reverse); make --announce_host and "
            f"--announce_maddrs name the same host")
