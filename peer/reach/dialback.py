"""The answering side of the reachability self-test: verify a peer's signed record and dial it back
at its announced addresses, only on the very host the request came from (no scanning through
us); the dial budget is spent only on verified requests, per source address first, then in all
(README.md of peer, "reach.dialback")."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import peer_id_of
from gossamer.crypto.signed import open_signed
from gossamer.peer.errors import RecordRejected
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.records import MAX_RECORD_BYTES, PeerRecord, open_record
from gossamer.transport.errors import TransportError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import read_body_into
from gossamer.transport.slots import address_key
from gossamer.transport.tcp import ConnectionInfo, TcpConfig, tcp_connect

TcpHandler = Callable[[Frame, ConnectionInfo], Awaitable[Frame | None]]

WHOAMI = "reach.whoami"
MAX_SOURCES = 4096  # source addresses remembered for the per-source limit


@dataclass(frozen=True, kw_only=True)
class DialBackLimits:
    """How much dialling one peer does for others.

    Attributes:
        per_source_s: at most one dial-back per source address (IPv6: /64) this often, whatever
            identities it presents.
        per_minute: at most this many dial-backs per minute in all.
        dial_timeout_s: deadline of each dial (connect and the whoami answer).

    Only a request whose record verifies and is admitted spends either budget, the source's first.
    """

    per_source_s: float = 10.0
    per_minute: int = 30
    dial_timeout_s: float = 3.0

    def __post_init__(self) -> None:
        if not self.per_source_s >= 0:
            raise ValueError(f"DialBackLimits.per_source_s must be >= 0, got {self.per_source_s!r}")
        if isinstance(self.per_minute, bool) or not isinstance(self.per_minute, int) or self.per_minute < 1:
            raise ValueError(f"DialBackLimits.per_minute must be a positive int, got {self.per_minute!r}")
        if not self.dial_timeout_s > 0:
            raise ValueError(f"DialBackLimits.dial_timeout_s must be positive, got {self.dial_timeout_s!r}")


def source_host(remote: str | None) -> str:
    """The request's source address, an IPv4-mapped IPv6 address written as IPv4."""
    try:
        address = ipaddress.ip_address((remote or "").split("%", 1)[0])
    except ValueError:
        return remote or ""
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def http_url(addr: str, path: str) -> str:
    """``http://host:port/path`` for a record's ``host:port`` (an IPv6 host in brackets)."""
    host, port = split_addr(addr)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"


class DialBack:
    """Serves ``/reach/dialback`` and ``/reach/whoami`` (and the TCP ``reach.whoami``) for one peer."""

    def __init__(self, *, peer_id: str, admission: Admission, ttl_s: float, now: Callable[[], float],
                 http_client: HttpClient, limits: DialBackLimits = DialBackLimits(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.peer_id = peer_id
        self._clock = clock
        self._admission = admission
        self._ttl_s = ttl_s
        self._now = now
        self._http = http_client
        self._limits = limits
        self._last: OrderedDict[str, float] = OrderedDict()
        self._recent: deque[float] = deque(maxlen=limits.per_minute)
        self.answered = 0

    def routes(self) -> list[web.RouteDef]:
        return [web.put("/reach/dialback", self._dialback), web.get("/reach/whoami", self._whoami)]

    def tcp_methods(self) -> dict[str, TcpHandler]:
        return {WHOAMI: self._tcp_whoami}

    async def _whoami(self, request: web.Request) -> web.Response:
        return web.json_response({"peer_id": self.peer_id})

    async def _tcp_whoami(self, frame: Frame, info: ConnectionInfo) -> Frame:
        return Frame(FrameType.RESPONSE, {"peer_id": self.peer_id})

    async def _dialback(self, request: web.Request) -> web.Response:
        source = source_host(request.remote)
        blob = bytes(await read_body_into(request, max_bytes=MAX_RECORD_BYTES))
        record = self._verified(blob)  # nothing is spent on a request that does not verify
        refused = self._spend(address_key((source,)))
        if refused:
            raise web.HTTPTooManyRequests(text=refused)
        hosts = {split_addr(addr)[0] for addr in (record.http_addr, record.tcp_addr) if addr}
        if hosts - {source}:
            why = (f"you connect from {source} but announce {', '.join(sorted(hosts))}; only the address a "
                   "request comes from is dialled")
            return web.json_response({"observed": source, "http": False, "tcp": False, "why": why})
        http_ok, tcp_ok = await asyncio.gather(self._dial_http(record), self._dial_tcp(record))
        self.answered += 1
        return web.json_response({"observed": source, "http": http_ok, "tcp": tcp_ok, "why": ""})

    def _spend(self, source: str) -> str:
        """Spend one dial-back of ``source``'s budget and of the global one; why not ("") when either is out."""
        now = self._clock()
        last = self._last.get(source)
        if last is not None and now - last < self._limits.per_source_s:
            return f"dial-back rate limit for your address (one per {self._limits.per_source_s:g} s): ask again later"
        if len(self._recent) == self._recent.maxlen and now - self._recent[0] < 60.0:
            return "dial-back rate limit of this peer: ask again later"
        self._recent.append(now)
        self._last[source] = now
        self._last.move_to_end(source)
        while len(self._last) > MAX_SOURCES:
            self._last.popitem(last=False)
        return ""

    def _verified(self, blob: bytes) -> PeerRecord:
        try:
            record = open_record(blob, subkey=claimed_peer_id(blob), now=self._now(), ttl_s=self._ttl_s)
            self._admission.check(record, now=self._now())
        except RecordRejected as exc:
            raise web.HTTPForbidden(text=f"dial-back refused: {exc}") from exc
        return record

    async def _dial_http(self, record: PeerRecord) -> bool:
        if not record.http_addr:
            return False
        try:
            async with asyncio.timeout(self._limits.dial_timeout_s):
                answer = await self._http.get_json(http_url(record.http_addr, "/reach/whoami"))
        except (TransportError, TimeoutError):
            return False
        return isinstance(answer, dict) and answer.get("peer_id") == record.peer_id

    async def _dial_tcp(self, record: PeerRecord) -> bool:
        if not record.tcp_addr:
            return False
        host, port = split_addr(record.tcp_addr)
        timeout_s = self._limits.dial_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                connection = await tcp_connect(host, port, config=TcpConfig(connect_timeout_s=timeout_s))
                try:
                    answer = await connection.request(Frame(FrameType.REQUEST, {"method": WHOAMI}))
                finally:
                    await connection.aclose()
        except (TransportError, TimeoutError):
            return False
        return answer.header.get("peer_id") == record.peer_id


def claimed_peer_id(blob: bytes) -> str:
    """The peer id the record claims (``open_record`` then checks it against the signing key)."""
    try:
        _body, public_key = open_signed(blob, max_bytes=MAX_RECORD_BYTES)
    except VerificationError as exc:
        raise RecordRejected("the record is unsigned or its signature does not verify", reason="signature") from exc
    return peer_id_of(public_key)
