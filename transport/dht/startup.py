"""Starting and stopping hivemind's p2pd and the DHT node on it: a busy port is refused before p2pd
starts, p2pd is never left running after a failure, and ``DhtStartFailed`` / ``BootstrapFailed``
name the flag to change (README.md, "Starting and stopping")."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket

from hivemind.dht.node import DHTNode
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.dht.validation import RecordValidatorBase
from hivemind.p2p import P2P, P2PDaemonError, P2PHandlerError, PeerID
from hivemind.utils.multiaddr import Multiaddr

from gossamer.transport.dht.config import DhtConfig, tcp_port
from gossamer.transport.dht.storage import BoundedStorage, RefusingCache
from gossamer.transport.errors import TransportError

logger = logging.getLogger(__name__)

HIVEMIND_ERRORS = (P2PDaemonError, P2PHandlerError, OSError, EOFError)
"""What hivemind raises for a failed request or a dead daemon."""
_SHUTDOWN_TIMEOUT_S = 5.0


class BootstrapFailed(TransportError):
    """None of the initial peers could be reached, so this node did not join the network."""


class DhtStartFailed(TransportError):
    """hivemind's p2pd (or the DHT node on top of it) did not start: bad address, busy port, ..."""


def check_ports_free(host_maddrs: tuple[str, ...]) -> None:
    """Fail early on a busy port: p2pd listens with SO_REUSEPORT and would share it silently."""
    for text in host_maddrs:
        maddr = Multiaddr(text)
        family = socket.AF_INET if "ip4" in maddr else socket.AF_INET6 if "ip6" in maddr else None
        port = tcp_port(maddr)
        if family is None or not port:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((maddr["ip4" if family == socket.AF_INET else "ip6"], port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise DhtStartFailed(f"host_maddrs: port {port} is in use ({text}): pick another "
                                         f"--host_maddrs port or use /tcp/0") from exc
                raise DhtStartFailed(f"host_maddrs: cannot listen on {text}: {exc.strerror}; use an "
                                     f"address of this host, e.g. /ip4/0.0.0.0/tcp/{port}") from exc


def _bootstrap_failed(config: DhtConfig, what: str) -> BootstrapFailed:
    tried = ", ".join(config.initial_peers)
    return BootstrapFailed(
        f"could not join the DHT: {what}. Tried --initial_peers {tried}. Check that the first peer is "
        f"running, that no firewall blocks its TCP port, and that you copied the full multiaddr it "
        f"printed, including /p2p/PEERID; or pass --new_swarm to start a new network.")


def _tracking_p2p_class(started: list[P2P]) -> type[P2P]:
    """A P2P subclass that hands out its instance as soon as ``create`` builds it.

    ``P2P.create`` does not stop or reap p2pd when it fails (or is cancelled) after launching it;
    with the instance in hand, ``start_p2p`` can.
    """

    class _TrackedP2P(P2P):
        def __init__(self) -> None:
            super().__init__()
            started.append(self)

    return _TrackedP2P


async def start_p2p(config: DhtConfig) -> P2P:
    """Start hivemind's p2pd; it connects to ``initial_peers`` before reporting ready."""
    started: list[P2P] = []
    try:
        return await _start_tracked_p2p(config, _tracking_p2p_class(started))
    except BaseException:
        for p2p in started:
            await stop_p2p(p2p)
        raise


async def _start_tracked_p2p(config: DhtConfig, p2p_class: type[P2P]) -> P2P:
    try:
        return await p2p_class.create(
            initial_peers=list(config.initial_peers) or None,
            host_maddrs=list(config.host_maddrs),
            announce_maddrs=list(config.announce_maddrs) or None,
            dht_mode="client" if config.client_mode else "server",
            startup_timeout=config.bootstrap_timeout_s,
        )
    except P2PDaemonError as exc:
        raise _p2pd_failure(config, str(exc)) from exc
    except OSError as exc:
        raise DhtStartFailed(f"could not launch hivemind's p2pd: {exc}; check the hivemind install") from exc


def _p2pd_failure(config: DhtConfig, cause: str) -> TransportError:
    if "bootstrap peers" in cause:
        return _bootstrap_failed(config, "p2pd could not connect to any initial peer")
    if "address already in use" in cause:
        return DhtStartFailed(f"host_maddrs: a port is in use ({cause}): pick another --host_maddrs "
                              f"port or use /tcp/0")
    return DhtStartFailed(f"hivemind's p2pd did not start: {cause}. Check --host_maddrs "
                          f"{' '.join(config.host_maddrs)} (addresses of this host) and the hivemind install.")


async def start_node(config: DhtConfig, p2p: P2P, validator: RecordValidatorBase, storage: BoundedStorage) -> DHTNode:
    """Run a DHTNode with ``validator`` and ``storage`` on ``p2p`` (no cache: every gossamer read asks
    for the latest entries); raise BootstrapFailed if no initial peer answers a DHT ping."""
    try:
        async with asyncio.timeout(config.bootstrap_timeout_s + config.request_timeout_s):
            node = await DHTNode.create(
                p2p=p2p, initial_peers=list(config.initial_peers), client_mode=config.client_mode,
                wait_timeout=config.request_timeout_s / 3, bootstrap_timeout=config.bootstrap_timeout_s,
                ensure_bootstrap_success=False, record_validator=validator, cache_locally=False, cache_nearest=0,
                cache_on_store=False, cache_refresh_before_expiry=0)
            install_storage(node.protocol, storage)
    except TimeoutError as exc:
        if config.initial_peers:
            raise _bootstrap_failed(config, "the DHT bootstrap timed out") from exc
        raise DhtStartFailed("the DHT node did not start within bootstrap_timeout_s") from exc
    except HIVEMIND_ERRORS as exc:
        raise DhtStartFailed(f"the DHT node did not start: {exc!r}") from exc
    if config.initial_peers and not await _reaches_initial_peer(node, config):
        await stop_node(node)
        raise _bootstrap_failed(config, "no initial peer answered a DHT ping")
    return node


def install_storage(protocol: DHTProtocol, storage: BoundedStorage) -> None:
    """Put ``storage`` (and a cache that keeps nothing) in place of hivemind's unbounded ones, moving
    over what others stored while the node was starting (within the new storage's limits)."""
    started: DHTLocalStorage = protocol.storage
    protocol.storage, protocol.cache = storage, RefusingCache(storage.refused)
    for key, item in list(started.items()):
        if isinstance(item.value, DictionaryDHTValue):
            for subkey, (value, expiration) in item.value.items():
                storage.store_subkey(key, subkey, value, expiration)


async def _reaches_initial_peer(node: DHTNode, config: DhtConfig) -> bool:
    """True when the routing table has a peer, or else one initial peer answers a ping now."""
    if node.protocol.routing_table.uid_to_peer_id:
        return True
    peer_ids = {PeerID.from_base58(Multiaddr(text)["p2p"]) for text in config.initial_peers}
    try:
        async with asyncio.timeout(config.request_timeout_s):
            answers = await asyncio.gather(*(node.protocol.call_ping(peer_id) for peer_id in peer_ids))
    except TimeoutError:
        return False
    return any(answer is not None for answer in answers)


async def stop_node(node: DHTNode) -> None:
    """Remove the node's handlers from p2pd; failures are logged, as p2pd is stopped next anyway."""
    try:
        async with asyncio.timeout(_SHUTDOWN_TIMEOUT_S):
            await node.shutdown()
    except (TimeoutError, *HIVEMIND_ERRORS) as exc:
        logger.debug("DHT node shutdown failed (p2pd is stopped next anyway): %r", exc)


async def stop_p2p(p2p: P2P) -> None:
    """Stop p2pd and wait for it; kill it if SIGTERM was not enough. Never leaves it running."""
    child = getattr(p2p, "_child", None)  # hivemind keeps its p2pd process private
    try:
        async with asyncio.timeout(_SHUTDOWN_TIMEOUT_S):
            await p2p.shutdown()
    except TimeoutError:
        logger.warning("p2pd did not exit within %.0f s of SIGTERM; killing it", _SHUTDOWN_TIMEOUT_S)
    if child is None or child.returncode is not None:
        return
    try:
        child.kill()
        async with asyncio.timeout(_SHUTDOWN_TIMEOUT_S):
            await child.wait()
    except ProcessLookupError:
        pass
    except TimeoutError as exc:
        raise TransportError(f"p2pd (pid {child.pid}) did not exit after SIGKILL") from exc
