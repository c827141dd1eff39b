"""What one connecting peer can hold on a server, shared by the TCP and HTTP servers: ``FairSlots``
(live connections in all and per IPv4 address or IPv6 /64, shared fairly among addresses when full),
``AddressSlots`` (per address only) and ``ByteBudget`` (bytes in flight). None waits or does I/O: a
refusal is answered at once, an eviction is named for its server to carry out."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

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


Conn = TypeVar("Conn", bound=Hashable)
FULL = "connection cap reached"
ADDRESS_FULL = "too many connections from your address"


@dataclass(frozen=True)
class Admission(Generic[Conn]):
    """What ``FairSlots.admit`` decided: ``admitted``; else ``refused`` says why (``FULL`` or
    ``ADDRESS_FULL``); ``evicted`` is a connection to close now, whose slot the newcomer took."""

    admitted: bool
    evicted: Conn | None = None
    refused: str = ""


class FairSlots(Generic[Conn]):
    """Live connections, at most ``total`` in all and ``per_address`` per address key; when all
    ``total`` are held, a newcomer whose address holds fewer than the heaviest address minus one
    takes the slot of that address's oldest idle connection (its oldest, if none is idle).

    The slots converge to a max-min fair share among the addresses that want them: many slow
    connections from a few addresses (issue 30: 260 from 16) cannot keep out an address that holds
    few; an address never loses a slot to one that would then hold as many as it.
    """

    def __init__(self, total: int, per_address: int) -> None:
        for name, value in (("total", total), ("per_address", per_address)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.total = total
        self.per_address = per_address
        self._by_key: dict[str, dict[Conn, None]] = {}  # oldest first
        self._key_of: dict[Conn, str] = {}
        self.evictions = 0

    def admit(self, key: str, conn: Conn, *, busy: Callable[[Conn], bool] = lambda _: False) -> Admission[Conn]:
        """Count ``conn`` (from ``key``) if it may be served; see the class docstring. ``busy(c)``:
        whether a held connection is mid-request (such are evicted last)."""
        if conn in self._key_of:
            raise ValueError(f"connection {conn!r} is already admitted")
        held = self.held(key)
        if held >= self.per_address:
            return Admission(False, refused=ADDRESS_FULL)
        evicted = None
        if len(self._key_of) >= self.total:
            heaviest = max(self._by_key, key=lambda k: len(self._by_key[k]))
            if held + 1 >= len(self._by_key[heaviest]):
                return Admission(False, refused=FULL)
            conns = self._by_key[heaviest]
            evicted = next((c for c in conns if not busy(c)), next(iter(conns)))
            self.release(evicted)
            self.evictions += 1
        self._by_key.setdefault(key, {})[conn] = None
        self._key_of[conn] = key
        return Admission(True, evicted=evicted)

    def release(self, conn: Conn) -> bool:
        """``conn`` closed (or was evicted); False if it held no slot (already released, refused)."""
        key = self._key_of.pop(conn, None)
        if key is None:
            return False
        conns = self._by_key[key]
        del conns[conn]
        if not conns:
            del self._by_key[key]
        return True

    def held(self, key: str) -> int:
        """Connections ``key`` holds now."""
        conns = self._by_key.get(key)
        return len(conns) if conns else 0

    def __len__(self) -> int:
        """Connections held now, in all."""
        return len(self._key_of)

    @property
    def addresses(self) -> int:
        """How many address keys hold a connection now."""
        return len(self._by_key)


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
