"""``Rejoiner``: a DHT node that lost every peer (its process stalled) bootstraps again before its
next request instead of staying alone; at most one attempt per ``retry_s``, and a failed attempt
never fails the request it came before (README.md, "Rejoining")."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable

from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P, PeerID
from hivemind.utils.multiaddr import Multiaddr

from gossamer.transport.dht.startup import HIVEMIND_ERRORS

log = logging.getLogger(__name__)

REMEMBERED_PEERS = 32
"""Peers of the routing table a node keeps in mind to rejoin through (besides its initial peers)."""


class Rejoiner:
    """Bootstraps a DHT node again when its routing table is empty (see the module docstring)."""

    def __init__(self, initial_peers: Iterable[str], *, retry_s: float, timeout_s: float,
                 remembered: int = REMEMBERED_PEERS, clock: Callable[[], float] = time.monotonic) -> None:
        self._initial = {PeerID.from_base58(Multiaddr(text)["p2p"]): Multiaddr(text) for text in initial_peers}
        self._known: list[PeerID] = []  # from the last routing table that had peers
        self._remembered = remembered
        self._retry_s = retry_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._next_try = float("-inf")
        self._alone_since: float | None = None
        self._warned = False  # this spell without a peer was logged
        self.rejoined = 0
        """How many times this node found itself alone and joined the DHT again."""

    def candidates(self, connected: Iterable[PeerID], me: PeerID) -> list[PeerID]:
        """Whom to rejoin through: the initial peers, the peers p2pd is still connected to, then
        the peers this node knew."""
        ordered = [*self._initial, *connected, *self._known]
        return [peer for peer in dict.fromkeys(ordered) if peer != me]

    async def ensure_joined(self, node: DHTNode, p2p: P2P) -> None:
        """Bootstrap again when ``node``'s routing table is empty (at most once per ``retry_s``).
        The first node of a new swarm, with nobody to ask yet, waits for the others to come."""
        table = node.protocol.routing_table
        if table.peer_id_to_uid:
            self._known = list(itertools.islice(table.peer_id_to_uid, self._remembered))
            self._alone_since = None
            self._warned = False
            return
        now = self._clock()
        if now < self._next_try:
            return
        self._next_try = now + self._retry_s
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._bootstrap(node, p2p)
        except (TimeoutError, *HIVEMIND_ERRORS) as exc:
            log.debug("joining the DHT again failed this time: %r", exc)
        self._alone_since = now if self._alone_since is None else self._alone_since
        if table.peer_id_to_uid:
            self.rejoined += 1
            log.info("the DHT node joined again after %.1f s without a peer: %d peer(s) in its routing table",
                     self._clock() - self._alone_since, len(table.peer_id_to_uid))
            self._alone_since = None
            self._warned = False

    async def _bootstrap(self, node: DHTNode, p2p: P2P) -> None:
        connected = {info.peer_id for info in await p2p.list_peers()}
        await asyncio.gather(*(_connect(p2p, peer, maddr, timeout_s=node.protocol.wait_timeout)
                               for peer, maddr in self._initial.items() if peer not in connected))
        candidates = self.candidates(connected, me=p2p.peer_id)
        if not candidates:
            return
        if not self._warned:
            self._warned = True
            log.warning("the DHT node has no peer left in its routing table (its requests to them went "
                        "unanswered: they left, or this host or its network stalled); joining again through "
                        "%d known peer(s)", len(candidates))
        answers = await asyncio.gather(*(node.protocol.call_ping(peer) for peer in candidates))
        if any(answer is not None for answer in answers):
            await node.find_nearest_nodes([node.node_id])  # refill the table, as DHTNode.create does


async def _connect(p2p: P2P, peer: PeerID, maddr: Multiaddr, *, timeout_s: float) -> None:
    """Dial an initial peer at its address (p2pd may have forgotten it since the start); a failure is
    left to the ping that follows to report."""
    address = maddr.decapsulate(Multiaddr(f"/p2p/{peer}"))
    try:
        async with asyncio.timeout(timeout_s):
            await p2p._client.connect(peer, [address])  # hivemind keeps its daemon client private
    except (TimeoutError, *HIVEMIND_ERRORS, AttributeError) as exc:
        log.debug("could not dial initial peer %s: %r", peer, exc)
