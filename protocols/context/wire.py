"""Ring frames: what cp-shards send each other over TCP (``plan``, ``kv``, ``dkv``, ``share``,
``update``, ``abort``; the table is in ``README.md``), sealed in an envelope bound to the body
and payload, and ``open_frame``: the checks, in order, that a frame's sender is a live cp-shard
holding the key that signed, before a byte of its payload is used.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gossamer.crypto.envelope import MAX_ENVELOPE_BYTES, ReplayGuard, payload_digest, seal
from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity
from gossamer.peer.errors import PeerError
from gossamer.protocols.context.names import METHOD
from gossamer.transport.errors import DecodeError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.header import pack_header, unpack_header

PLAN, KV, DKV, SHARE, UPDATE, ABORT = "plan", "kv", "dkv", "share", "update", "abort"
OPS = (PLAN, KV, DKV, SHARE, UPDATE, ABORT)
MAX_BODY_BYTES = 1 << 20
MAX_REASON_CHARS = 500
_ATTEMPT = re.compile(r"[0-9a-f]{16}")
_PEER_ID = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
Buffer = bytes | bytearray | memoryview


class FrameRefused(PeerError):
    """A ring frame that must not be used; ``code`` names the check it failed (a short word:
    "header", "length", "envelope", "sender", "stale", "busy", or a ``protocols.context.core`` code)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Outbound:
    """A frame's signed part, ready to be sealed for any recipient: op, step, body bytes, payload
    and their digest (computed once, however many recipients)."""

    op: str
    step: int
    body_bytes: bytes
    payload: Buffer | Sequence[Buffer]
    digest: bytes


@dataclass(frozen=True)
class Opened(Outbound):
    """A frame whose envelope verified: who sent it and its decoded body."""

    sender: str
    sender_key: bytes
    body: dict[str, Any]

    @property
    def attempt(self) -> str:
        return self.body["attempt"]

    @property
    def payload_bytes(self) -> int:
        return memoryview(self.payload).nbytes


def new_attempt() -> str:
    """A fresh attempt id: 16 hex digits, never reused."""
    return secrets.token_hex(8)


def outbound(op: str, step: int, body: Mapping[str, Any], payload: Buffer | Sequence[Buffer] = b"") -> Outbound:
    """The signed part of an ``op`` frame (``body`` gets ``op`` and ``step`` added)."""
    body_bytes = pack_header({"op": op, "step": step, **body})
    views = [memoryview(part).cast("B") for part in (payload if isinstance(payload, list | tuple) else [payload])]
    return Outbound(op=op, step=step, body_bytes=body_bytes, payload=views,
                    digest=payload_digest(body_bytes, *views))


ENVELOPE_METHOD = "RING"  # the envelope's method and target bind it to a ring frame of one op


def envelope_target(op: str) -> str:
    return f"/{METHOD}/{op}"


def frame_for(signed: Outbound, identity: Identity, *, recipient: str, run_id: str, now: float) -> Frame:
    """The REQUEST frame carrying ``signed`` to ``recipient``, with an envelope from ``identity``.
    Passing on a verified frame (a kv to the successor) is ``frame_for(opened, ...)``: the same
    body and payload under this hop's envelope."""
    envelope = seal(identity, recipient=recipient, run_id=run_id, round=signed.step, method=ENVELOPE_METHOD,
                    target=envelope_target(signed.op), payload_digest=signed.digest, now=now,
                    nonce=secrets.token_bytes(16))
    return Frame(FrameType.REQUEST, {"method": METHOD, "op": signed.op, "step": signed.step, "env": envelope,
                                     "body": signed.body_bytes}, signed.payload)


def clear_header(frame: Frame) -> tuple[str, int]:
    """(op, step) from the unsigned header; FrameRefused("header") unless well formed."""
    header = frame.header
    op, step = header.get("op"), header.get("step")
    if op not in OPS or isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise FrameRefused(f"header: op must be one of {OPS} and step a non-negative integer", code="header")
    env, body = header.get("env"), header.get("body")
    if not isinstance(env, bytes) or len(env) > MAX_ENVELOPE_BYTES:
        raise FrameRefused("header: env must be the signed envelope's bytes", code="header")
    if not isinstance(body, bytes) or len(body) > MAX_BODY_BYTES:
        raise FrameRefused(f"header: body must be at most {MAX_BODY_BYTES} bytes", code="header")
    return op, step


def open_frame(frame: Frame, *, guard: ReplayGuard, me: str, run_id: str, now: float, max_payload: int,
               sender_ok: Callable[[str, bytes], bool]) -> Opened:
    """Verify a frame's envelope and decode its body; FrameRefused says which check failed.

    The sender is authenticated here (it holds the key it claims and signed exactly these bytes
    for this peer and run, recently, once) and admitted by ``sender_ok(peer id, public key)``
    (a live cp-shard of the run with that key) before the guard remembers its nonce, so keys
    that are not in the run cannot fill the guard; whether that sender may send this op is the
    role's check, against the step."""
    op, step = clear_header(frame)
    payload = frame.payload if not isinstance(frame.payload, list | tuple) else b"".join(frame.payload)
    size = memoryview(payload).nbytes
    if size > max_payload:
        raise FrameRefused(f"length: a {op} frame here carries at most {max_payload} bytes, got {size}", code="length")
    body_bytes = frame.header["body"]
    digest = payload_digest(body_bytes, memoryview(payload).cast("B"))
    try:
        envelope = guard.check(frame.header["env"], me=me, run_id=run_id, method=ENVELOPE_METHOD,
                               target=envelope_target(op), now=now)
    except VerificationError:
        raise FrameRefused("envelope refused", code="envelope") from None
    try:
        if not sender_ok(envelope.sender, envelope.sender_public_key):
            raise FrameRefused(f"sender: {envelope.sender[:12]} is not a live cp-shard of this run", code="sender")
        guard.admit(envelope, payload_digest=digest, now=now)
    except VerificationError:
        raise FrameRefused("envelope refused", code="envelope") from None
    finally:
        guard.release(envelope)
    try:
        body = unpack_header(body_bytes)
    except DecodeError as exc:
        raise FrameRefused(f"header: body does not decode: {exc}", code="header") from exc
    if not isinstance(body, dict) or body.get("op") != op or body.get("step") != step:
        raise FrameRefused("header: the signed body does not name this frame's op and step", code="header")
    if not isinstance(body.get("attempt"), str) or not _ATTEMPT.fullmatch(body["attempt"]):
        raise FrameRefused("header: attempt must be 16 hex digits", code="header")
    return Opened(op=op, step=step, body_bytes=body_bytes, payload=payload, digest=digest, sender=envelope.sender,
                  sender_key=envelope.sender_public_key, body=body)


# -- the ops' fields --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One step as its leader planned it (the ``plan`` op): who is in the ring, in order."""

    step: int
    attempt: str
    members: tuple[str, ...]
    chunk_tokens: int
    batch_size: int
    data: str
    state: tuple[int, str] | None = None

    @property
    def leader(self) -> str:
        return self.members[0]

    @property
    def chunks(self) -> int:
        return len(self.members)

    @property
    def context(self) -> int:
        """Tokens per training sequence of this step."""
        return self.chunks * self.chunk_tokens

    def body(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "members": list(self.members), "chunk_tokens": self.chunk_tokens,
                "batch_size": self.batch_size, "data": self.data,
                "state": None if self.state is None else list(self.state)}


def _positive(body: Mapping[str, Any], name: str) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FrameRefused(f"header: {name} must be a positive integer", code="header")
    return value


def parse_plan(opened: Opened, *, max_members: int) -> Plan:
    """The plan in a verified ``plan`` frame; FrameRefused("header") when a field is malformed."""
    body = opened.body
    members = body.get("members")
    if not isinstance(members, list) or not 1 <= len(members) <= max_members or len(set(members)) != len(members) \
            or not all(isinstance(m, str) and _PEER_ID.fullmatch(m) for m in members):
        raise FrameRefused(f"header: members must be 1-{max_members} distinct peer ids", code="header")
    data, state = body.get("data"), body.get("state")
    if not isinstance(data, str) or not _DIGEST.fullmatch(data):
        raise FrameRefused("header: data must be a SHA-256 hex digest", code="header")
    if state is not None:
        ok = isinstance(state, list) and len(state) == 2 and isinstance(state[0], int) and \
            not isinstance(state[0], bool) and isinstance(state[1], str) and _DIGEST.fullmatch(state[1])
        if not ok:
            raise FrameRefused("header: state must be null or [version, digest]", code="header")
        state = (state[0], state[1])
    return Plan(step=opened.step, attempt=opened.attempt, members=tuple(members),
                chunk_tokens=_positive(body, "chunk_tokens"), batch_size=_positive(body, "batch_size"), data=data,
                state=state)


def parse_abort(opened: Opened) -> tuple[str, str | None]:
    """(reason, suspect) of a verified ``abort`` frame."""
    reason, suspect = opened.body.get("reason"), opened.body.get("suspect")
    if not isinstance(reason, str) or (suspect is not None and not (isinstance(suspect, str)
                                                                    and _PEER_ID.fullmatch(suspect))):
        raise FrameRefused("header: an abort names a reason and a suspect peer id or null", code="header")
    return reason[:MAX_REASON_CHARS], suspect


def number_field(opened: Opened, name: str) -> float:
    """A float field of a verified body (a loss, a norm)."""
    value = opened.body.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FrameRefused(f"header: {name} must be a number", code="header")
    return float(value)
