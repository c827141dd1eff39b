"""``SignedMessenger``: signed tensor messages between peers over HTTP, a safetensors body under a
signed envelope naming its endpoint. The receiver checks who is talking (signature, freshness,
nonce, a live admitted peer with the route's role) before it reads a body byte, and every refusal
is the same opaque 403 (README.md of peer, "kit.messaging")."""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from aiohttp import web
from yarl import URL

from gossamer.crypto.envelope import Envelope, ReplayGuard, payload_digest, seal
from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity
from gossamer.peer.run.view import PeerView
from gossamer.transport.errors import DecodeError
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import read_body_into
from gossamer.transport.limits import Limits
from gossamer.transport.safetensors_stream import decode_safetensors, encode_safetensors

ENVELOPE_HEADER = "X-Gossamer-Envelope"
MAX_ENVELOPE_CHARS = 8192
HEADER_SLACK_BYTES = 64 << 10
"""Room ``body_cap`` leaves for the safetensors header and metadata beyond the tensors' bytes."""
HEADER_BYTES_PER_TENSOR = 128
"""Room for one tensor's header entry (dtype, shape, offsets) beside its name."""


def body_cap(tensors: Mapping[str, torch.Tensor]) -> int:
    """The largest body a message carrying tensors of these names, shapes and dtypes may take
    (their bytes, a header entry each, and ``HEADER_SLACK_BYTES`` for metadata); no tensor is
    copied or moved."""
    return HEADER_SLACK_BYTES + sum(t.numel() * t.element_size() + len(name.encode()) + HEADER_BYTES_PER_TENSOR
                                    for name, t in tensors.items())


def request_target(url: str | URL) -> str:
    """The target an HTTP client sends for ``url`` (its encoded path and query): what is signed."""
    return URL(url).raw_path_qs


@dataclass(frozen=True)
class Reply:
    """The recipient's answer to a message, and the size of the body that was sent."""

    answer: dict[str, Any]
    size_bytes: int


@dataclass(frozen=True)
class Received:
    """A verified message: who sent it for which round, its tensors and metadata, its size."""

    envelope: Envelope
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str]
    size_bytes: int


class SignedMessenger:
    """Sends and receives signed tensor messages for one peer in one run."""

    def __init__(self, *, identity: Identity, run_id: str, client: HttpClient, view: PeerView,
                 now: Callable[[], float], limits: Limits, max_body_bytes: int) -> None:
        self._identity = identity
        self._run_id = run_id
        self._client = client
        self._view = view
        self._now = now
        self._limits = limits
        self._max_body_bytes = max_body_bytes
        self._guard = ReplayGuard(started_at=now())  # envelopes stamped before this process started are refused

    async def request(self, url: str, *, recipient: str, round: int, tensors: Mapping[str, torch.Tensor],
                      metadata: dict[str, str] | None = None) -> Reply:
        """PUT ``tensors`` to ``url`` for ``recipient``; the recipient's JSON answer and the body size.
        Transport errors propagate; an answer that is not a JSON object is a DecodeError."""
        total_bytes, chunks = encode_safetensors(tensors, metadata)
        envelope = seal(self._identity, recipient=recipient, run_id=self._run_id, round=round, method="PUT",
                        target=request_target(url), payload_digest=payload_digest(*chunks), now=self._now(),
                        nonce=secrets.token_bytes(16))
        header = base64.b64encode(envelope).decode("ascii")
        answer = await self._client.put_body(url, total_bytes, chunks, extra_headers={ENVELOPE_HEADER: header})
        if not isinstance(answer, dict):
            raise DecodeError(f"{url} answered with {type(answer).__name__}, not a JSON object")
        return Reply(answer=answer, size_bytes=total_bytes)

    async def send(self, url: str, *, recipient: str, round: int, tensors: Mapping[str, torch.Tensor],
                   metadata: dict[str, str] | None = None) -> int:
        """``request``, when only delivery matters: returns the body size."""
        reply = await self.request(url, recipient=recipient, round=round, tensors=tensors, metadata=metadata)
        return reply.size_bytes

    async def receive(self, request: web.Request, *, sender_role: str, round: int, max_body_bytes: int) -> Received:
        """Verify and decode a message from a live peer with ``sender_role`` for ``round``, whose
        body is at most ``max_body_bytes`` (see ``body_cap``); raises 403 (opaque) before any body
        byte is read, then 413 / 503 / 400 (bad body) HTTP errors."""
        envelope = self._check(request, sender_role=sender_role, round=round)
        try:
            body = await read_body_into(request, max_bytes=min(max_body_bytes, self._max_body_bytes))
            try:
                self._guard.admit(envelope, payload_digest=payload_digest(body), now=self._now())
            except VerificationError as exc:
                raise web.HTTPForbidden(text="envelope refused") from exc
        finally:
            self._guard.release(envelope)
        try:
            tensors, metadata = decode_safetensors(body, limits=self._limits)
        except DecodeError as exc:
            raise web.HTTPBadRequest(text=f"bad safetensors body: {exc}") from exc
        return Received(envelope=envelope, tensors=tensors, metadata=metadata, size_bytes=len(body))

    def _check(self, request: web.Request, *, sender_role: str, round: int) -> Envelope:
        """The envelope, if everything but the body checks out; 403 otherwise."""
        blob = self._envelope_blob(request)
        try:
            envelope = self._guard.check(blob, me=self._identity.peer_id, run_id=self._run_id, method=request.method,
                                         target=request.rel_url.raw_path_qs, now=self._now())
        except VerificationError as exc:
            raise web.HTTPForbidden(text="envelope refused") from exc
        live = self._view.get(envelope.sender)
        if (live is None or live.record.public_key != envelope.sender_public_key
                or sender_role not in live.record.roles or envelope.round != round):
            self._guard.release(envelope)
            raise web.HTTPForbidden(text="envelope refused")
        return envelope

    @staticmethod
    def _envelope_blob(request: web.Request) -> bytes:
        text = request.headers.get(ENVELOPE_HEADER, "")
        if not text or len(text) > MAX_ENVELOPE_CHARS:
            raise web.HTTPForbidden(text="envelope refused")
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise web.HTTPForbidden(text="envelope refused") from exc
