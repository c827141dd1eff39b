"""Encrypted request/response links between two peers over the TCP transport (TL++ traffic).

A link is one TCP connection carrying one ``crypto.channel`` session::

    client -> REQUEST {method, op: "hello", peer: <client peer id>}   payload: client hello
    server -> RESPONSE {sid}                                         payload: server hello
    client -> REQUEST {method, sid, op, step}   payload: Enc_c2s(body, ad = {sid, op, step, "request"})
    server -> RESPONSE {sid, op, step}          payload: Enc_s2c(body, ad = {sid, op, step, "reply"})

Each side authenticates the other's hello against a key it already knows: the client against the
server's signed peer record (or the run owner's key), the server against the key ``authorize``
returns for the peer id the client claims (and ``authorize`` decides who may talk to it at all).
A body is a length-prefixed msgpack map ``{fields, tensors}`` followed by the tensors' raw bytes
(``transport.codec``), encrypted whole with ChaCha20-Poly1305; the frame's op and step ride in
the clear header and are bound to the ciphertext as associated data.

Counters are implicit, so frames must be decrypted in the order they were encrypted: a link has
at most one request outstanding (``SecureLink.request`` holds a lock), and a link that failed in
any way (timeout, lost connection, a frame that did not verify) is closed, never reused. A
tampered, replayed or reordered frame fails to decrypt: the server drops the session and answers
with an error, the client closes the link and raises ``SecureLinkError``. A handler refusing a
request (``RequestRefused``) answers with an encrypted error reply instead; the link stays usable.

Errors::

    PeerError
     ├── SecureLinkError    the link failed and is closed (handshake refused, a frame that did not
     │                      verify, timeout, connection lost, peer not in the view)
     └── RequestRefused     the other side refused one request; ``code`` says why, the link lives on
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gossamer.crypto.channel import MAX_HELLO_BYTES, ChannelHandshake, SecureChannel
from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity
from gossamer.peer.errors import PeerError
from gossamer.peer.metrics import Traffic
from gossamer.peer.run.view import PeerView
from gossamer.transport.codec import decode_tensors, encode_tensors
from gossamer.transport.errors import DecodeError, TransportError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.header import pack_header, unpack_header
from gossamer.transport.limits import DEFAULT_LIMITS, Limits
from gossamer.transport.tcp import HandlerError, TcpConfig, TcpConnection, tcp_connect

log = logging.getLogger(__name__)

HELLO = "hello"
ERROR_OP = "error"
MAX_OP_CHARS = 32
_LENGTH_BYTES = 4


class SecureLinkError(PeerError):
    """The link failed and was closed; the message names the peer and what happened."""


class RequestRefused(PeerError):
    """The other side refused a request (``code``: a short category such as "refused",
    "stale", "helper"); the message says why."""

    def __init__(self, message: str, *, code: str = "refused") -> None:
        super().__init__(message)
        self.code = code


@dataclass
class LinkMessage:
    """One request or reply: an op, the step it belongs to, small fields and named tensors."""

    op: str
    step: int
    fields: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def pack_body(message: LinkMessage) -> bytes:
    """The plaintext of a message: 4-byte length, msgpack {fields, tensors}, the tensors' bytes."""
    entries, buffers = encode_tensors({k: t.detach().cpu().contiguous() for k, t in message.tensors.items()})
    meta = pack_header({"fields": message.fields, "tensors": entries})
    return b"".join([len(meta).to_bytes(_LENGTH_BYTES, "big"), meta, *buffers])


def unpack_body(op: str, step: int, body: bytes, *, limits: Limits) -> LinkMessage:
    """Inverse of ``pack_body``; DecodeError for anything malformed (floats must be finite)."""
    view = memoryview(body)
    if view.nbytes < _LENGTH_BYTES:
        raise DecodeError("secure link body is shorter than its length prefix")
    size = int.from_bytes(view[:_LENGTH_BYTES], "big")
    if _LENGTH_BYTES + size > view.nbytes:
        raise DecodeError(f"secure link body declares {size} header bytes but has {view.nbytes - _LENGTH_BYTES}")
    meta = unpack_header(view[_LENGTH_BYTES:_LENGTH_BYTES + size], limits=limits)
    if not isinstance(meta, dict) or set(meta) != {"fields", "tensors"} or not isinstance(meta["fields"], dict):
        raise DecodeError("secure link body header must be a map {fields: map, tensors: list}")
    payload = bytearray(view[_LENGTH_BYTES + size:])
    tensors = decode_tensors(meta["tensors"], payload, limits=limits, require_finite=True)
    return LinkMessage(op=op, step=step, fields=meta["fields"], tensors=tensors)


def associated_data(sid: str, op: str, step: int, direction: str) -> bytes:
    """What each frame's ciphertext is bound to: its session, op, step and direction."""
    return pack_header([sid, op, step, direction])


def _check_op(op: object, step: object) -> tuple[str, int]:
    if not isinstance(op, str) or not 0 < len(op) <= MAX_OP_CHARS:
        raise DecodeError(f"secure link frame has a bad op {op!r:.40}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise DecodeError(f"secure link frame has a bad step {step!r:.40}")
    return op, step


# --- client -------------------------------------------------------------------------------------------


class SecureLink:
    """The client end of one encrypted link; build it with ``SecureLink.connect``."""

    def __init__(self, conn: TcpConnection, channel: SecureChannel, sid: str, *, method: str, peer_id: str,
                 traffic: Traffic | None, limits: Limits) -> None:
        self._conn = conn
        self._channel = channel
        self._sid = sid
        self._method = method
        self.peer_id = peer_id
        self._traffic = traffic
        self._limits = limits
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def connect(cls, *, identity: Identity, run_id: str, peer_id: str, public_key: bytes, address: str,
                      method: str, timeout_s: float, traffic: Traffic | None = None,
                      tcp_config: TcpConfig | None = None) -> SecureLink:
        """Dial ``address`` (host:port) and run the handshake against ``public_key``."""
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise SecureLinkError(f"peer {peer_id[:12]} has no usable TCP address ({address!r})")
        config = tcp_config or TcpConfig(connect_timeout_s=timeout_s)
        handshake = ChannelHandshake(identity, peer_public_key=public_key, run_id=run_id, initiator=True)
        try:
            conn = await tcp_connect(host, int(port), config=config)
        except TransportError as exc:
            raise SecureLinkError(f"cannot reach peer {peer_id[:12]} at {address}: {exc}") from exc
        try:
            reply = await conn.request(Frame(FrameType.REQUEST, {"method": method, "op": HELLO,
                                                                 "peer": identity.peer_id}, handshake.hello()),
                                       timeout_s=timeout_s)
            sid = reply.header.get("sid")
            if not isinstance(sid, str):
                raise DecodeError("handshake reply carries no session id")
            channel = handshake.finish(bytes(reply.payload))
        except (TransportError, VerificationError) as exc:
            await conn.aclose()
            what = "did not verify" if isinstance(exc, VerificationError) else str(exc)
            raise SecureLinkError(f"handshake with peer {peer_id[:12]} failed: {what}") from exc
        except BaseException:
            await conn.aclose()
            raise
        return cls(conn, channel, sid, method=method, peer_id=peer_id, traffic=traffic,
                   limits=config.limits)

    @property
    def closed(self) -> bool:
        return self._closed or self._conn.closed

    async def request(self, message: LinkMessage, *, timeout_s: float) -> LinkMessage:
        """Send ``message`` and return the reply. RequestRefused when the other side refused it
        (the link stays open); SecureLinkError, with the link closed, for any other failure."""
        async with self._lock:
            if self.closed:
                raise SecureLinkError(f"link to peer {self.peer_id[:12]} is closed")
            try:
                return await self._exchange(message, timeout_s)
            except RequestRefused:
                raise  # an answer like any other: the counters are in step
            except (TransportError, VerificationError) as exc:
                await self.aclose()
                what = "a reply that did not verify" if isinstance(exc, VerificationError) else str(exc)
                raise SecureLinkError(f"link to peer {self.peer_id[:12]} failed during {message.op!r} "
                                      f"(step {message.step}): {what}") from exc
            except BaseException:
                await self.aclose()  # cancelled mid-request: the counters can no longer be trusted
                raise

    async def _exchange(self, message: LinkMessage, timeout_s: float) -> LinkMessage:
        op, step = _check_op(message.op, message.step)
        sealed = self.seal(message)
        reply = await self._conn.request(sealed, timeout_s=timeout_s)
        reply_op, reply_step = _check_op(reply.header.get("op"), reply.header.get("step"))
        if reply_step != step or reply_op not in (op, ERROR_OP):
            raise DecodeError(f"reply to {op!r} step {step} is labelled {reply_op!r} step {reply_step}")
        body = self._channel.decrypt(reply.payload, associated_data(self._sid, reply_op, reply_step, "reply"))
        self._count(op, len(sealed.payload), len(memoryview(reply.payload)))
        answer = unpack_body(reply_op, reply_step, body, limits=self._limits)
        if reply_op == ERROR_OP:
            raise RequestRefused(str(answer.fields.get("error", "refused"))[:1000],
                                 code=str(answer.fields.get("code", "refused"))[:MAX_OP_CHARS])
        return answer

    def seal(self, message: LinkMessage) -> Frame:
        """Encrypt ``message`` as the link's next request frame (tests use it to replay or reorder)."""
        op, step = _check_op(message.op, message.step)
        payload = self._channel.encrypt(pack_body(message), associated_data(self._sid, op, step, "request"))
        return Frame(FrameType.REQUEST, {"method": self._method, "sid": self._sid, "op": op, "step": step}, payload)

    def _count(self, op: str, sent: int, received: int) -> None:
        if self._traffic is not None:
            self._traffic.add_sent(f"tlpp_{op}", sent)
            self._traffic.add_received(f"tlpp_{op}", received)

    async def aclose(self) -> None:
        """Close the connection (idempotent)."""
        self._closed = True
        await self._conn.aclose()


# --- server -------------------------------------------------------------------------------------------

Handler = Callable[[str, LinkMessage], Awaitable[LinkMessage]]
Authorize = Callable[[str], bytes]
"""``authorize(peer id)`` returns the peer's Ed25519 public key, or raises RequestRefused."""


@dataclass
class _Session:
    peer_id: str
    channel: SecureChannel
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SecureLinkServer:
    """The server end: answers hellos, decrypts requests, runs ``handler``, encrypts replies.

    One session per client peer (a new hello replaces the peer's old session), at most
    ``max_sessions`` in all (the oldest is dropped). Requests of one session are handled one at
    a time, in order. Its TCP gate (``tcp_gates``) checks the caller before a payload byte is
    read: a hello may carry at most ``MAX_HELLO_BYTES``, any other frame must name a live
    session and carry at most ``max_frame_bytes``; anything else is refused unread.
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
        self.refused_frames = 0

    def tcp_methods(self) -> dict[str, Callable[[Frame], Awaitable[Frame | None]]]:
        return {self.method: self.serve}

    def tcp_gates(self) -> dict[str, Callable[[dict[str, Any], int], None]]:
        return {self.method: self.admit}

    def admit(self, header: dict[str, Any], payload_len: int) -> None:
        """Before a frame's payload is read: HandlerError unless it is a hello of hello size, or
        a frame of a live session within ``max_frame_bytes``."""
        if header.get("op") == HELLO:
            if payload_len > MAX_HELLO_BYTES:
                raise HandlerError(f"secure link: a hello of {payload_len} bytes (at most {MAX_HELLO_BYTES})")
            return
        sid = header.get("sid")
        if not isinstance(sid, str) or sid not in self._sessions:
            raise HandlerError("secure link: unknown or closed session; open a new link")
        if payload_len > self._max_frame_bytes:
            raise HandlerError(f"secure link: a frame of {payload_len} bytes (at most {self._max_frame_bytes})")

    async def serve(self, frame: Frame) -> Frame:
        """Answer one REQUEST frame of this method."""
        if frame.header.get("op") == HELLO:
            return self._hello(frame)
        sid = frame.header.get("sid")
        session = self._sessions.get(sid) if isinstance(sid, str) else None
        if session is None:
            raise HandlerError("secure link: unknown or closed session; open a new link")
        try:
            op, step = _check_op(frame.header.get("op"), frame.header.get("step"))
        except DecodeError as exc:
            self._drop(sid, session)
            raise HandlerError(f"secure link: {exc}; session closed") from exc
        async with session.lock:
            return await self._answer(sid, session, op, step, frame.payload)

    def _hello(self, frame: Frame) -> Frame:
        peer_id = frame.header.get("peer")
        if not isinstance(peer_id, str) or not peer_id:
            raise HandlerError("secure link: the hello names no peer")
        try:
            public_key = self._authorize(peer_id)
            handshake = ChannelHandshake(self._identity, peer_public_key=public_key, run_id=self._run_id,
                                         initiator=False)
            channel = handshake.finish(bytes(frame.payload))
        except RequestRefused as exc:
            raise HandlerError(f"secure link: {exc}") from exc
        except (VerificationError, ValueError) as exc:
            raise HandlerError("secure link: handshake refused") from exc
        for old_sid, old in list(self._sessions.items()):
            if old.peer_id == peer_id:
                del self._sessions[old_sid]
        while len(self._sessions) >= self._max_sessions:
            self._sessions.popitem(last=False)
        sid = secrets.token_hex(16)
        self._sessions[sid] = _Session(peer_id=peer_id, channel=channel)
        return Frame(FrameType.RESPONSE, {"sid": sid}, handshake.hello())

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
        plaintext = pack_body(reply)
        sealed = session.channel.encrypt(plaintext, associated_data(sid, reply_op, step, "reply"))
        if self._traffic is not None:
            self._traffic.add_received(f"tlpp_{op}", len(memoryview(payload)))
            self._traffic.add_sent(f"tlpp_{op}", len(sealed))
        return Frame(FrameType.RESPONSE, {"sid": sid, "op": reply_op, "step": step}, sealed)

    def _drop(self, sid: str, session: _Session) -> None:
        if self._sessions.get(sid) is session:
            del self._sessions[sid]

    @property
    def sessions(self) -> int:
        return len(self._sessions)


# --- a peer's links, by peer id --------------------------------------------------------------------------


class SecureLinks:
    """The links one peer holds, one per (peer id, method), dialled from the peer's signed record
    on first use and again after a failure (a failed link is never reused)."""

    def __init__(self, *, identity: Identity, run_id: str, view: PeerView, traffic: Traffic | None = None,
                 tcp_config: TcpConfig | None = None) -> None:
        self._identity = identity
        self._run_id = run_id
        self._view = view
        self._traffic = traffic
        self._tcp_config = tcp_config
        self._links: dict[tuple[str, str], SecureLink] = {}
        self._dialing: dict[tuple[str, str], asyncio.Lock] = {}

    async def request(self, peer_id: str, method: str, message: LinkMessage, *, timeout_s: float) -> LinkMessage:
        """``message`` to ``peer_id``'s ``method``; SecureLinkError or RequestRefused as ``SecureLink.request``."""
        link = await self._link(peer_id, method, timeout_s)
        try:
            return await link.request(message, timeout_s=timeout_s)
        finally:
            if link.closed and self._links.get((peer_id, method)) is link:
                del self._links[(peer_id, method)]

    async def _link(self, peer_id: str, method: str, timeout_s: float) -> SecureLink:
        key = (peer_id, method)
        async with self._dialing.setdefault(key, asyncio.Lock()):
            link = self._links.get(key)
            if link is not None and not link.closed:
                return link
            live = self._view.get(peer_id)
            if live is None:
                raise SecureLinkError(f"peer {peer_id[:12]} is not in the run's view")
            link = await SecureLink.connect(identity=self._identity, run_id=self._run_id, peer_id=peer_id,
                                            public_key=live.record.public_key, address=live.record.tcp_addr,
                                            method=method, timeout_s=timeout_s, traffic=self._traffic,
                                            tcp_config=self._tcp_config)
            self._links[key] = link
            return link

    async def drop(self, peer_id: str) -> None:
        """Close every link to ``peer_id``."""
        for key in [k for k in self._links if k[0] == peer_id]:
            await self._links.pop(key).aclose()

    async def aclose(self) -> None:
        links, self._links = list(self._links.values()), {}
        for link in links:
            await link.aclose()

