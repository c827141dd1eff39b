"""``RelayConfig``: what a relay volunteers and what strangers may hold of it; ``RelayRefused``, what
a refused allocation raises; ``descriptor_cap``, the relay's share of the process's descriptors."""

from __future__ import annotations

import resource
from dataclasses import dataclass

from gossamer.transport.errors import TransportError

SPLICE_FDS = 6  # descriptors a spliced pair holds beyond its two sockets (two dups, two kernel pipes)


class RelayRefused(TransportError):
    """A relay refused an allocation: not authorized, full, or a bad request (the message says which)."""


@dataclass(frozen=True, kw_only=True)
class RelayConfig:
    """What a relay volunteers, and what strangers may hold of it.

    Attributes:
        max_peers: most private peers relayed at once.
        max_peers_per_address: most of them whose control connection comes from one address (IPv6: /64).
        max_untrusted_peers: most of them the relay's ``trusted`` does not vouch for (the rest of
            ``max_peers`` stays for those it does), so new identities cannot fill it.
        max_connections: most connections (spliced or waiting for the peer) per relayed peer.
        rate_bytes_per_s: bytes per second per relayed peer, both directions together (0: no cap).
        attach_timeout_s: how long an incoming connection waits for the private peer to attach.
        line_timeout_s: a new control or attach connection must send its first line within this.
        max_unproven: most connections, in all, that have not proven anything yet (a control
            connection before its allocation, an attach connection from an address no relayed peer
            is at, before its line); beyond, a new one is closed at once.
        max_unproven_per_address: most of those from one address.
        max_open: most descriptors the relay's connections hold in all; never more than half the
            process's own limit (``RLIMIT_NOFILE``), so a flood cannot starve the rest of the process.
        control_timeout_s: a control connection silent this long is dropped (clients ping every third).
        max_services: most ports one allocation may ask for.
        auth_skew_s: most seconds between the relay's clock and the time a peer signed its proof.
        zero_copy: splice relayed connections in the kernel (Linux ``os.splice``) rather than copy
            them through Python; the same pace and caps either way (False: the copy path).
    """

    max_peers: int = 16
    max_peers_per_address: int = 4
    max_untrusted_peers: int = 8
    max_connections: int = 32
    rate_bytes_per_s: float = 16 * 1024 * 1024
    attach_timeout_s: float = 10.0
    line_timeout_s: float = 5.0
    max_unproven: int = 256
    max_unproven_per_address: int = 16
    max_open: int = 4096
    control_timeout_s: float = 60.0
    max_services: int = 4
    auth_skew_s: float = 30.0
    zero_copy: bool = True

    def __post_init__(self) -> None:
        for name in ("max_peers", "max_peers_per_address", "max_untrusted_peers", "max_connections", "max_services",
                     "max_unproven", "max_unproven_per_address", "max_open"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.rate_bytes_per_s >= 0:
            raise ValueError(f"rate_bytes_per_s must be >= 0 (0: no cap), got {self.rate_bytes_per_s!r}")
        for name in ("attach_timeout_s", "line_timeout_s", "control_timeout_s", "auth_skew_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")


def descriptor_cap(configured: int) -> int:
    """``configured``, and never more than half this process's soft descriptor limit."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return configured if soft == resource.RLIM_INFINITY else max(16, min(configured, soft // 2))
