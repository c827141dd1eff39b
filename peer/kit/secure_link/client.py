"""The client end of one secure link: dial, run the handshake, then one request at a time."""

from __future__ import annotations

import asyncio
from typing import Any

from gossamer.crypto.channel import SecureChannel
from gossamer.crypto.errors import VerificationError
from gossamer.crypto.handshake import HANDSHAKE_NONCE_BYTES, Initiator
from gossamer.crypto.identity import Identity
from gossamer.peer.kit.secure_link.message import (
    CONFIRM,
    COOKIE,
    ERROR_OP,
    HELLO,
    MAX_OP_CHARS,
    LinkMessage,
    RequestRefused,
    SecureLinkError,
    associated_data,
    check_op,
    pack_body,
    traffic_kind,
    unpack_body,
)
from gossamer.peer.metrics import Traffic
from gossamer.transport.errors import DecodeError, TransportError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.limits import Limits
from gossamer.transport.tcp import TcpConfig, TcpConnection, tcp_connect


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
        """Dial ``address`` (host:port) and run the handshake against ``public_key``: a cookie (the
        hello's nonce, which binds it to this connection), hello and answer, then the confirmation
        and its ack, on this one connection."""
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise SecureLinkError(f"peer {peer_id[:12]} has no usable TCP address ({address!r})")
        config = tcp_config or TcpConfig(connect_timeout_s=timeout_s)
        try:
            conn = await tcp_connect(host, int(port), config=config)
        except TransportError as exc:
            raise SecureLinkError(f"cannot reach peer {peer_id[:12]} at {address}: {exc}") from exc
        try:
            cookie = await conn.request(Frame(FrameType.REQUEST, {"method": method, "op": COOKIE}, b""),
                                        timeout_s=timeout_s)
            nonce = bytes(cookie.payload)
            if len(nonce) != HANDSHAKE_NONCE_BYTES:
                raise DecodeError(f"the cookie has {len(nonce)} bytes, not {HANDSHAKE_NONCE_BYTES}")
            handshake = Initiator(identity, peer_public_key=public_key, run_id=run_id, nonce=nonce)
            answer = await conn.request(Frame(FrameType.REQUEST, {"method": method, "op": HELLO,
                                                                  "peer": identity.peer_id}, handshake.hello()),
                                        timeout_s=timeout_s)
            sid = _session_id(answer.header)
            confirmation = handshake.confirm(bytes(answer.payload))
            ack = await conn.request(Frame(FrameType.REQUEST, {"method": method, "op": CONFIRM, "sid": sid},
                                           confirmation), timeout_s=timeout_s)
            if _session_id(ack.header) != sid:
                raise DecodeError("the handshake's ack names another session")
            channel = handshake.finish(bytes(ack.payload))
        except (TransportError, VerificationError) as exc:
            await conn.aclose()
            what = "did not verify" if isinstance(exc, VerificationError) else str(exc)
            raise SecureLinkError(f"handshake with peer {peer_id[:12]} failed: {what}") from exc
        except BaseException:
            await conn.aclose()
            raise
        return cls(conn, channel, sid, method=method, peer_id=peer_id, traffic=traffic, limits=config.limits)

    @property
    def closed(self) -> bool:
        return self._closed or self._conn.closed

    @property
    def session_id(self) -> str:
        """The session's id (it travels in the clear in every frame's header)."""
        return self._sid

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
        op, step = check_op(message.op, message.step)
        sealed = self.seal(message)
        reply = await self._conn.request(sealed, timeout_s=timeout_s)
        reply_op, reply_step = check_op(reply.header.get("op"), reply.header.get("step"))
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
        """Encrypt ``message`` as the link's next request frame (tests use it to replay or reorder);
        ValueError for an op the link itself uses (hello, confirm, error)."""
        op, step = check_op(message.op, message.step)
        if op in (HELLO, CONFIRM, ERROR_OP):
            raise ValueError(f"op {op!r} is reserved by the secure link itself")
        payload = self._channel.encrypt(pack_body(message), associated_data(self._sid, op, step, "request"))
        return Frame(FrameType.REQUEST, {"method": self._method, "sid": self._sid, "op": op, "step": step}, payload)

    def _count(self, op: str, sent: int, received: int) -> None:
        if self._traffic is not None:
            kind = traffic_kind(self._method, op)
            self._traffic.add_sent(kind, sent)
            self._traffic.add_received(kind, received)

    async def aclose(self) -> None:
        """Close the connection (idempotent)."""
        self._closed = True
        await self._conn.aclose()


def _session_id(header: dict[str, Any]) -> str:
    sid = header.get("sid")
    if not isinstance(sid, str):
        raise DecodeError("handshake reply carries no session id")
    return sid
