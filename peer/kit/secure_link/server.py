"""``SecureLinkServer``: the server end of secure links. A session exists only once its handshake is
confirmed on one connection, answers frames from that connection alone, and ends at the first
frame that fails to decrypt (README.md of peer, "kit.secure_link.server")."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gossamer.crypto.channel import TAG_BYTES, SecureChannel
from gossamer.crypto.errors import VerificationError
from gossamer.crypto.handshake import MAX_HELLO_BYTES, Responder
from gossamer.crypto.identity import Identity
from gossamer.peer.kit.secure_link.message import (
    CONFIRM,
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


@dataclass
class _Pending:
    peer_id: str
    connection: int
    responder: Responder


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
    at most ``max_sessions`` in all (the oldest is dropped), and at most ``max_sessions`` pending
    handshakes (the oldest pending one is dropped, never a session). Requests of one session are
    handled one at a time, in order. Its TCP gate (``tcp_gates``) checks the caller before a
    payload byte is read: a hello or confirmation may carry at most ``MAX_CONFIRM_BYTES``, a
    confirmation must name a pending handshake and any other frame a live session, within
    ``max_frame_bytes``; anything else is refused unread.
    """

    def __init__(self, *, identity: Identity, run_id: str, method: str, authorize: Authorize, handler: Handler,
                 traffic: Traffic | None = None, limits: Limits = DEFAULT_LIMITS, max_sessions: int = 256,
                 max_frame_bytes: int | None = None) -> None:
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
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
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

    def _hello(self, frame: Frame, connection: ConnectionInfo) -> Frame:
        """Answer a hello with a pending handshake bound to this connection; no session changes."""
        peer_id = frame.header.get("peer")
        if not isinstance(peer_id, str) or not peer_id:
            raise HandlerError("secure link: the hello names no peer")
        try:
            public_key = self._authorize(peer_id)
            responder = Responder(self._identity, peer_public_key=public_key, run_id=self._run_id)
            answer = responder.answer(bytes(frame.payload))
        except RequestRefused as exc:
            raise HandlerError(f"secure link: {exc}") from exc
        except (VerificationError, ValueError) as exc:
            raise HandlerError("secure link: handshake refused") from exc
        while len(self._pending) >= self._max_sessions:
            self._pending.popitem(last=False)
        sid = secrets.token_hex(16)
        self._pending[sid] = _Pending(peer_id=peer_id, connection=connection.connection_id, responder=responder)
        return Frame(FrameType.RESPONSE, {"sid": sid}, answer)

    def _confirm(self, frame: Frame, connection: ConnectionInfo) -> Frame:
        """Turn a pending handshake of this connection into the peer's session, once its
        confirmation verifies; only then is the peer's older session replaced."""
        sid, pending = self._owned(self._pending, frame, connection, what="handshake",
                                   missing="no such handshake; start again with a hello")
        del self._pending[sid]
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
