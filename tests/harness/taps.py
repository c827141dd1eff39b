"""What a ``LocalNet``'s peers sent, for a test to check against (``LocalNet.create(keep_sent=True)``):
the body of every HTTP PUT a peer made that its recipient took, by sender, recipient and path, as
sent (what the recipient decoded: messages are signed over their bytes); nothing in the roles changes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from yarl import URL

from gossamer.transport.http_client import HttpClient
from gossamer.transport.safetensors_stream import decode_safetensors


class SentBodies:
    """The bodies the net's peers PUT and their recipients took, by (sender, recipient, path):
    every one until the net closes (a short test's, not a long run's)."""

    def __init__(self) -> None:
        self._bodies: dict[tuple[str, str, str], bytes] = {}

    def keep(self, sender: str, recipient: str, path: str, body: bytes) -> None:
        self._bodies[sender, recipient, path] = body

    def tensors(self, sender: str, recipient: str, path: str) -> dict[str, torch.Tensor]:
        """The tensors of the safetensors body ``sender`` PUT to ``recipient`` at ``path``; KeyError
        when no such body was taken."""
        body = self._bodies.get((sender, recipient, path))
        if body is None:
            raise KeyError(f"{recipient} took no body from {sender} at {path}")
        return decode_safetensors(body)[0]



class TappedClient:
    """``client`` as peer ``sender`` uses it (a peer's ``http_client`` in a net that keeps what was
    sent): every call goes to ``client`` unchanged, a PUT's body is copied on the way and kept in
    ``sent`` once the recipient took it;
    ``recipient_of(host:port)`` names the live peer an address belongs to (None: none of the net's);
    it must not raise (whatever this raises, the role takes for a failed send)."""

    def __init__(self, client: HttpClient, *, sender: str, sent: SentBodies,
                 recipient_of: Callable[[str], str | None]) -> None:
        self._client = client
        self._sender = sender
        self._sent = sent
        self._recipient_of = recipient_of

    async def put_body(self, url: str, total_bytes: int, chunks: list[memoryview], *,
                       extra_headers: Mapping[str, str] | None = None) -> Any:
        target = URL(url)
        recipient = self._recipient_of(f"{target.host}:{target.port}")
        body = b"".join(bytes(chunk) for chunk in chunks) if recipient is not None else b""  # as it went
        answer = await self._client.put_body(url, total_bytes, chunks, extra_headers=extra_headers)
        if recipient is not None:
            self._sent.keep(self._sender, recipient, target.path, body)
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
