"""Signed tensor messages between peers over HTTP.

A message is a safetensors body PUT to the recipient, with a signed envelope (``crypto.envelope``)
in the ``X-Gossamer-Envelope`` header: sender, recipient, run id, round, timestamp, nonce and the
SHA-256 of the exact body bytes. The receiver reads the body into one buffer, hashes it, opens
the envelope with its replay guard (wrong key, tampered byte, another recipient, a replayed nonce
or a stale timestamp all end in the same opaque 403), checks that the sender is a live, admitted
peer of the run whose record carries the key that signed, and only then decodes the tensors.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from aiohttp import web

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
        self._guard = ReplayGuard()

    async def request(self, url: str, *, recipient: str, round: int, tensors: Mapping[str, torch.Tensor],
                      metadata: dict[str, str] | None = None) -> Reply:
        """PUT ``tensors`` to ``url`` for ``recipient``; the recipient's JSON answer and the body size.
        Transport errors propagate; an answer that is not a JSON object is a DecodeError."""
        total_bytes, chunks = encode_safetensors(tensors, metadata)
        envelope = seal(self._identity, recipient=recipient, run_id=self._run_id, round=round,
                        payload_digest=payload_digest(*chunks), now=self._now(), nonce=secrets.token_bytes(16))
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

    async def receive(self, request: web.Request) -> Received:
        """Verify and decode a message; raises 403 (opaque) or 400 (bad body) HTTP errors."""
        blob = self._envelope_blob(request)
        body = await read_body_into(request, max_bytes=self._max_body_bytes)
        try:
            envelope = self._guard.open(blob, me=self._identity.peer_id, run_id=self._run_id,
                                        payload_digest=payload_digest(body), now=self._now())
        except VerificationError as exc:
            raise web.HTTPForbidden(text="envelope refused") from exc
        live = self._view.get(envelope.sender)
        if live is None or live.record.public_key != envelope.sender_public_key:
            raise web.HTTPForbidden(text="envelope refused")
        try:
            tensors, metadata = decode_safetensors(body, limits=self._limits)
        except DecodeError as exc:
            raise web.HTTPBadRequest(text=f"bad safetensors body: {exc}") from exc
        return Received(envelope=envelope, tensors=tensors, metadata=metadata, size_bytes=len(body))

    @staticmethod
    def _envelope_blob(request: web.Request) -> bytes:
        text = request.headers.get(ENVELOPE_HEADER, "")
        if not text or len(text) > MAX_ENVELOPE_CHARS:
            raise web.HTTPForbidden(text="envelope refused")
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise web.HTTPForbidden(text="envelope refused") from exc
