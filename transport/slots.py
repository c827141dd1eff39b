"""What one connecting peer can hold on a server, shared by the TCP and HTTP servers: ``AddressSlots``
(live connections per IPv4 address or IPv6 /64) and ``ByteBudget`` (bytes of bodies or payloads in
flight). Neither waits: a refusal is answered at once; both are owned by one server."""

from __future__ import annotations

import ipaddress
from typing import Any

from gossamer.transport.errors import Overloaded

IPV6_PREFIX_BITS = 64


def address_key(peername: Any) -> str:
    """The key a connection from ``peername`` (``transport.get_extra_info("peername")`` or
    ``sock.getpeername()``) counts against; a non-IP peer (a Unix socket) is one key, ``"local"``."""
    host = peername[0] if isinstance(peername, tuple) and peername else None
    if not isinstance(host, str):
        return "local"
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_PREFIX_BITS), strict=False))
    return str(address)


class AddressSlots:
    """Live connections per address key, at most ``per_address`` each."""

    def __init__(self, per_address: int) -> None:
        if isinstance(per_address, bool) or not isinstance(per_address, int) or per_address <= 0:
            raise ValueError(f"per_address must be a positive int, got {per_address!r}")
        self.per_address = per_address
        self._open: dict[str, int] = {}

    def take(self, key: str) -> bool:
        """Count one more connection from ``key``; False (nothing counted) when it is at the cap."""
        held = self._open.get(key, 0)
        if held >= self.per_address:
            return False
        self._open[key] = held + 1
        return True

    def give(self, key: str) -> None:
        """A connection ``take`` counted has closed."""
        held = self._open.get(key, 0)
        if held <= 1:
            self._open.pop(key, None)
        else:
            self._open[key] = held - 1

    def held(self, key: str) -> int:
        return self._open.get(key, 0)

    def __len__(self) -> int:
        """How many address keys hold a connection now."""
        return len(self._open)


class ByteBudget:
    """Bytes of received bodies / payloads held at once, at most ``limit_bytes`` in all."""

    def __init__(self, limit_bytes: int, *, what: str = "receive") -> None:
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be a positive int, got {limit_bytes!r}")
        self.limit_bytes = limit_bytes
        self.what = what
        self.held_bytes = 0
        self.peak_bytes = 0
        self.refused = 0

    def reserve(self, nbytes: int) -> None:
        """Hold ``nbytes`` more; Overloaded (nothing held) if that would pass the limit."""
        if nbytes < 0:
            raise ValueError(f"cannot reserve {nbytes} bytes")
        if self.held_bytes + nbytes > self.limit_bytes:
            self.refused += 1
            raise Overloaded(f"overloaded: {self.what} budget full ({self.held_bytes} of {self.limit_bytes} bytes "
                             f"held, {nbytes} more asked for); retry later")
        self.held_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def release(self, nbytes: int) -> None:
        """Give back ``nbytes`` that ``reserve`` held."""
        if not 0 <= nbytes <= self.held_bytes:
            raise ValueError(f"cannot release {nbytes} bytes: {self.held_bytes} are held")
        self.held_bytes -= nbytes
