"""The secure links one peer holds, one per (peer id, method), dialled from the peer's signed
record on first use and again after a failure (a failed link is never reused)."""

from __future__ import annotations

import asyncio

from gossamer.crypto.identity import Identity
from gossamer.peer.kit.secure_link.client import SecureLink
from gossamer.peer.kit.secure_link.message import LinkMessage, SecureLinkError
from gossamer.peer.metrics import Traffic
from gossamer.peer.run.view import PeerView
from gossamer.transport.tcp import TcpConfig


class SecureLinks:
    """The links one peer holds, by (peer id, method)."""

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
