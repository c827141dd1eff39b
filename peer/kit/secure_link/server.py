"""``SecureLinkServer``: the server end of secure links. A hello is taken only with a cookie made for its
connection and fresh; a session exists only once its handshake is confirmed on that connection,
answers frames from it alone, and ends at the first frame that fails to decrypt (README.md of
peer, "kit.secure_link.server")."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gossamer.crypto.channel import TAG_BYTES, SecureChannel
from gossamer.crypto.errors import VerificationError
from gossamer.crypto.handshake import HANDSHAKE_NONCE_BYTES, MAX_HELLO_BYTES, Responder
from gossamer.crypto.identity import Identity
from gossamer.crypto.signed import decode_body, unwrap
from gossamer.peer.kit.secure_link.message import (
    CONFIRM,
    COOKIE,
    ERROR_OP,
    HELLO,
    LinkMessage,
    RequestRefused,
    associated_data,
    check_op,
    pack_body,
    traffic_kind,
    unpack_body,
)
from gossamer.peer.metrics import Traffic
from gossamer.transport.errors import DecodeError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.limits import DEFAULT_LIMITS, Limits
from gossamer.transport.tcp import ConnectionInfo, HandlerError

log = logging.getLogger(__name__)

Handler = Callable[[str, LinkMessage], Awaitable[LinkMessage]]
Authorize = Callable[[str], bytes]
"""``authorize(peer id)`` returns the peer's Ed25519 public key, or raises RequestRefused."""
MAX_CONFIRM_BYTES = MAX_HELLO_BYTES + TAG_BYTES
HELLO_WINDOW_S = 30.0
"""A cookie (the hello's nonce) is good for this long after it was issued, and a pending handshake
waits this long for its confirmation."""
MAX_PENDING_PER_PEER = 4
_STAMP_BYTES = 6  # milliseconds of the server's clock, in the cookie
_COOKIE_DOMAIN = b"gossamer-link-cookie-v1\0"


@dataclass
class _Pending:
    peer_id: str
    connection: int
    responder: Responder
    at: float


@dataclass
class _Session:
    peer_id: str
    connection: int
    channel: SecureChannel
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


Owned = TypeVar("Owned", _Pending, _Session)


class SecureLinkServer:
    """The server end: answers handshakes, decrypts requests, runs ``handler``, encrypts replies.

    One session per client peer (a newly *confirmed* handshake replaces the peer's old session),
    at most ``max_sessions`` in all (the oldest is dropped). A hello's nonce must be a cookie this
    server issued (``op: "cookie"``) to the same connection less than ``hello_window_s`` ago (an
    HMAC under a secret of this server over the time and the connection: no state); any other hello,
    a replayed one above all, is refused before its signature is checked. Pending handshakes: one
    per connection (a new hello replaces it), ``max_pending_per_peer`` per peer, ``max_sessions``
    in all (the oldest is dropped, never a session), each for ``hello_window_s``. Requests of one
    session are handled one at a time, in order. Its TCP gate (``tcp_gates``) checks the caller
    before a payload byte is read: a cookie request carries nothing, a hello or confirmation at
    most ``MAX_CONFIRM_BYTES``, a confirmation must name a pending handshake and any other frame a
    live session, within ``max_frame_bytes``; anything else is refused unread.
    """

    def __init__(self, *, identity: Identity, run_id: str, method: str, authorize: Authorize, handler: Handler,
                 traffic: Traffic | None = None, limits: Limits = DEFAULT_LIMITS, max_sessions: int = 256,
                 max_frame_bytes: int | None = None, hello_window_s: float = HELLO_WINDOW_S,
                 max_pending_per_peer: int = MAX_PENDING_PER_PEER, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        if not hello_window_s > 0 or not 0 < max_pending_per_peer <= max_sessions:
            raise ValueError(f"hello_window_s must be > 0 (got {hello_window_s!r}) and max_pending_per_peer "
                             f"in 1..max_sessions (got {max_pending_per_peer!r})")
        self._identity = identity
        self._run_id = run_id
        self.method = method
        self._authorize = authorize
        self._handler = handler
        self._traffic = traffic
        self._limits = limits
        self._max_sessions = max_sessions
        self._max_frame_bytes = limits.max_payload_bytes if max_frame_bytes is None else max_frame_bytes
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._pending: OrderedDict[str, _Pending] = OrderedDict()  # oldest first
        self._pending_of: dict[int, str] = {}  # connection id -> sid of its pending handshake
        self._hello_window_s = hello_window_s
        self._max_pending_per_peer = max_pending_per_peer
        self._clock = clock
        self._secret = secrets.token_bytes(32)
        self.refused_hellos = 0
        """Hellos refused before their signature was checked: no cookie of this connection, or a stale one."""
        self.refused_frames = 0
        """Frames of a session's own connection that did not verify (each ended its session)."""
        self.foreign_frames = 0
        """Frames naming a session or handshake from another connection (refused, nothing touched)."""

    def tcp_methods(self) -> dict[str, Callable[[Frame, ConnectionInfo], Awaitable[Frame | None]]]:
        return {self.method: self.serve}

    def tcp_gates(self) -> dict[str, Callable[[dict[str, Any], int], None]]:
        return {self.method: self.admit}

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def admit(self, header: dict[str, Any], payload_len: int) -> None:
        """Before a frame's payload is read: HandlerError unless it is a hello, a confirmation of a
        pending handshake, or a frame of a live session, each within its size."""
        op, sid = header.get("op"), header.get("sid")
        if op == COOKIE:
            if payload_len:
                raise HandlerError("secure link: a cookie request carries no payload")
            return
        if op in (HELLO, CONFIRM):
            if payload_len > MAX_CONFIRM_BYTES:
                raise HandlerError(f"secure link: a {op} of {payload_len} bytes (at most {MAX_CONFIRM_BYTES})")
            if op == CONFIRM and (not isinstance(sid, str) or sid not in self._pending):
                raise HandlerError("secure link: no such handshake; start again with a hello")
            return
        if not isinstance(sid, str) or sid not in self._sessions:
            raise HandlerError("secure link: unknown or closed session; open a new link")
        if payload_len > self._max_frame_bytes:
            raise HandlerError(f"secure link: a frame of {payload_len} bytes (at most {self._max_frame_bytes})")

    async def serve(self, frame: Frame, connection: ConnectionInfo) -> Frame:
        """Answer one REQUEST frame of this method that arrived on ``connection``."""
        op = frame.header.get("op")
        if op == COOKIE:
            return Frame(FrameType.RESPONSE, {"op": COOKIE}, self._cookie(connection, self._now_ms()))
        if op == HELLO:
            return self._hello(frame, connection)
        if op == CONFIRM:
            return self._confirm(frame, connection)
        sid, session = self._owned(self._sessions, frame, connection, what="session",
                                   missing="unknown or closed session; open a new link")
        try:
            op, step = check_op(op, frame.header.get("step"))
        except DecodeError as exc:
            self._drop(sid, session)
            raise HandlerError(f"secure link: {exc}; session closed") from exc
        async with session.lock:
            return await self._answer(sid, session, op, step, frame.payload)

    def _owned(self, table: OrderedDict[str, Owned], frame: Frame, connection: ConnectionInfo, *, what: str,
               missing: str) -> tuple[str, Owned]:
        """(sid, entry) of the session or pending handshake the frame names, if it belongs to
        ``connection``; HandlerError otherwise (a foreign frame is counted, the entry untouched)."""
        sid = frame.header.get("sid")
        entry = table.get(sid) if isinstance(sid, str) else None
        if entry is None:
            raise HandlerError(f"secure link: {missing}")
        if entry.connection != connection.connection_id:
            self.foreign_frames += 1
            raise HandlerError(f"secure link: that {what} belongs to another connection")
        return sid, entry

    def _now_ms(self) -> int:
        return min(max(0, int(self._clock() * 1000)), (1 << 8 * _STAMP_BYTES) - 1)

    def _cookie(self, connection: ConnectionInfo, stamp_ms: int) -> bytes:
        """The nonce a hello on ``connection`` must carry: the issue time and a MAC binding it there."""
        stamp = stamp_ms.to_bytes(_STAMP_BYTES, "big")
        bound = b"%d|%r" % (connection.connection_id, tuple(connection.peer))
        mac = hmac.new(self._secret, _COOKIE_DOMAIN + stamp + bound, hashlib.sha256).digest()
        return stamp + mac[:HANDSHAKE_NONCE_BYTES - _STAMP_BYTES]

    def _check_cookie(self, payload: bytes, connection: ConnectionInfo) -> None:
        """HandlerError unless the hello's (not yet verified) nonce is a fresh cookie of this connection."""
        try:
            body = decode_body(unwrap(payload, max_bytes=MAX_HELLO_BYTES), max_bytes=MAX_HELLO_BYTES)
        except VerificationError:
            body = {}
        nonce = body.get("nonce")
        if not isinstance(nonce, bytes) or len(nonce) != HANDSHAKE_NONCE_BYTES:
            self.refused_hellos += 1
            raise HandlerError("secure link: handshake refused")
        stamp_ms = int.from_bytes(nonce[:_STAMP_BYTES], "big")
        if not hmac.compare_digest(nonce, self._cookie(connection, stamp_ms)):
            self.refused_hellos += 1
            raise HandlerError("secure link: the hello's nonce is no cookie of this connection (replayed?); "
                               "ask for a cookie on this connection, then say hello")
        age_s = (self._now_ms() - stamp_ms) / 1000
        if age_s > self._hello_window_s:
            self.refused_hellos += 1
            raise HandlerError(f"secure link: stale hello (its cookie is {age_s:.0f} s old, at most "
                               f"{self._hello_window_s:.0f} s); ask for a new cookie")

    def _expire_pending(self) -> None:
        now = self._clock()
        while self._pending:
            sid, oldest = next(iter(self._pending.items()))
            if now - oldest.at <= self._hello_window_s:
                return
            self._forget(sid)

    def _forget(self, sid: str) -> _Pending | None:
        pending = self._pending.pop(sid, None)
        if pending is not None and self._pending_of.get(pending.connection) == sid:
            del self._pending_of[pending.connection]
        return pending

    def _hello(self, frame: Frame, connection: ConnectionInfo) -> Frame:
        """Answer a hello with a pending handshake bound to this connection; no session changes."""
        peer_id = frame.header.get("peer")
        if not isinstance(peer_id, str) or not peer_id:
            raise HandlerError("secure link: the hello names no peer")
        self._check_cookie(bytes(frame.payload), connection)
        try:
            public_key = self._authorize(peer_id)
            responder = Responder(self._identity, peer_public_key=public_key, run_id=self._run_id)
            answer = responder.answer(bytes(frame.payload))
        except RequestRefused as exc:
            raise HandlerError(f"secure link: {exc}") from exc
        except (VerificationError, ValueError) as exc:
            raise HandlerError("secure link: handshake refused") from exc
        self._expire_pending()
        if connection.connection_id in self._pending_of:
            self._forget(self._pending_of[connection.connection_id])
        peers = [sid for sid, pending in self._pending.items() if pending.peer_id == peer_id]
        for sid in peers[:max(0, len(peers) - self._max_pending_per_peer + 1)]:
            self._forget(sid)
        while len(self._pending) >= self._max_sessions:
            self._forget(next(iter(self._pending)))
        sid = secrets.token_hex(16)
        self._pending[sid] = _Pending(peer_id=peer_id, connection=connection.connection_id, responder=responder,
                                      at=self._clock())
        self._pending_of[connection.connection_id] = sid
        return Frame(FrameType.RESPONSE, {"sid": sid}, answer)

    def _confirm(self, frame: Frame, connection: ConnectionInfo) -> Frame:
        """Turn a pending handshake of this connection into the peer's session, once its
        confirmation verifies; only then is the peer's older session replaced."""
        self._expire_pending()
        sid, pending = self._owned(self._pending, frame, connection, what="handshake",
                                   missing="no such handshake (or older than hello_window_s); start again with "
                                           "a cookie and a hello")
        self._forget(sid)
        try:
            channel, ack = pending.responder.confirm(bytes(frame.payload))
        except VerificationError as exc:
            raise HandlerError("secure link: handshake refused") from exc
        for old_sid, old in list(self._sessions.items()):
            if old.peer_id == pending.peer_id:
                del self._sessions[old_sid]
        while len(self._sessions) >= self._max_sessions:
            self._sessions.popitem(last=False)
        self._sessions[sid] = _Session(peer_id=pending.peer_id, connection=connection.connection_id,
                                       channel=channel)
        return Frame(FrameType.RESPONSE, {"sid": sid}, ack)

    async def _answer(self, sid: str, session: _Session, op: str, step: int, payload: Any) -> Frame:
        try:
            body = session.channel.decrypt(payload, associated_data(sid, op, step, "request"))
        except VerificationError as exc:
            self._drop(sid, session)
            self.refused_frames += 1
            log.warning("secure link from %s: a %r frame did not verify (tampered, replayed or out of order); "
                        "session closed", session.peer_id[:12], op)
            raise HandlerError("secure link: frame refused (tampered, replayed or out of order); session closed") from exc
        try:
            reply = await self._handler(session.peer_id, unpack_body(op, step, body, limits=self._limits))
            reply_op = op
        except (RequestRefused, DecodeError) as exc:
            code = exc.code if isinstance(exc, RequestRefused) else "malformed"
            reply, reply_op = LinkMessage(ERROR_OP, step, {"error": str(exc), "code": code}), ERROR_OP
        sealed = session.channel.encrypt(pack_body(reply), associated_data(sid, reply_op, step, "reply"))
        if self._traffic is not None:
            kind = traffic_kind(self.method, op)
            self._traffic.add_received(kind, len(memoryview(payload)))
            self._traffic.add_sent(kind, len(sealed))
        return Frame(FrameType.RESPONSE, {"sid": sid, "op": reply_op, "step": step}, sealed)

    def _drop(self, sid: str, session: _Session) -> None:
        if self._sessions.get(sid) is session:
            del self._sessions[sid]
