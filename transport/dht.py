"""Control-plane membership over a hivemind DHT: opaque byte records under ``gossamer/`` keys.

One ``DhtMembership`` per daemon runs a hivemind ``DHTNode`` inside the caller's asyncio loop; the
only other process is hivemind's ``p2pd`` child, which ``aclose()`` stops and checks is gone.
This module knows keys, subkeys, bytes and expirations; what a record means (signed peer record,
manifest) is decided above it. Callers pass keys such as ``run/demo@ab12cd34/peers``; they are
stored as ``gossamer/run/demo@ab12cd34/peers``.

Semantics worth knowing (hivemind 1.1.12):

- A key holds a dictionary: one subkey per writer (a peer id), each with its own expiration.
  For each subkey the DHT keeps the value with the LATEST expiration time; a store with an
  earlier (or already passed) expiration is rejected (``store`` returns False).
- hivemind cannot delete. ``withdraw`` therefore stores an empty tombstone ``b""``, which
  replaces the old value only if the tombstone's expiration is LATER than the record's (use the
  record's expiration plus a margin). ``get_all`` hides tombstones; after the tombstone expires
  the subkey is gone entirely. Empty values are thus reserved and ``store`` refuses them.
- Expirations are DHT time: use ``now()`` (hivemind's ``get_dht_time``) to compute them.
- Anyone in the swarm can write any msgpack value under any key; ``get_all`` skips subkeys that
  are not ``str``, values that are not ``bytes``, and values over ``max_value_bytes``.

Errors: bad config raises ``ValueError`` naming the field; a failed start raises
``DhtStartFailed`` or ``BootstrapFailed``; a request raises ``TransportTimeout`` past its
deadline, ``DecodeError`` for a value hivemind cannot decode, ``TransportError`` otherwise.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack
from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P, P2PDaemonError, P2PHandlerError, PeerID
from hivemind.utils.multiaddr import Multiaddr
from hivemind.utils.multiaddr.exceptions import Error as MultiaddrError
from hivemind.utils.timed_storage import ValueWithExpiration, get_dht_time

from gossamer.transport.errors import DecodeError, TransportError, TransportTimeout

logger = logging.getLogger(__name__)

KEY_PREFIX = "gossamer/"
PEER_MADDR_FORM = "/ip4/HOST/tcp/PORT/p2p/PEERID"
_HIVEMIND_ERRORS = (P2PDaemonError, P2PHandlerError, OSError, EOFError)
_SHUTDOWN_TIMEOUT_S = 5.0
_T = TypeVar("_T")


class BootstrapFailed(TransportError):
    """None of the initial peers could be reached, so this node did not join the network."""


class DhtStartFailed(TransportError):
    """hivemind's p2pd (or the DHT node on top of it) did not start: bad address, busy port, ..."""


@dataclass(frozen=True, kw_only=True)
class DhtConfig:
    """How a daemon joins (or starts) the DHT.

    Attributes:
        initial_peers: full multiaddrs (``/ip4/HOST/tcp/PORT/p2p/PEERID``) of running peers to join.
        host_maddrs: multiaddrs to listen on; ``/tcp/0`` picks a free port.
        announce_maddrs: public multiaddrs to advertise instead (behind NAT); explicit ports only.
        new_swarm: start a new network (then ``initial_peers`` must be empty).
        client_mode: only make requests, never serve or store for others (for unreachable hosts).
        bootstrap_timeout_s: time allowed for p2pd to start and the initial peers to answer.
        request_timeout_s: deadline of one whole store / get_all / withdraw; each hivemind RPC gets
            a third of it, so one silent peer cannot use up the whole deadline.
        max_value_bytes: largest record value stored or returned.
    """

    initial_peers: tuple[str, ...] = ()
    host_maddrs: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    announce_maddrs: tuple[str, ...] = ()
    new_swarm: bool = False
    client_mode: bool = False
    bootstrap_timeout_s: float = 15.0
    request_timeout_s: float = 5.0
    max_value_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        _check_maddrs("initial_peers", self.initial_peers, PEER_MADDR_FORM)
        _check_maddrs("host_maddrs", self.host_maddrs, "/ip4/HOST/tcp/PORT")
        _check_maddrs("announce_maddrs", self.announce_maddrs, "/ip4/HOST/tcp/PORT")
        if not self.host_maddrs:
            raise ValueError("host_maddrs: give at least one address to listen on, e.g. /ip4/0.0.0.0/tcp/0")
        for text in self.initial_peers:
            if "p2p" not in Multiaddr(text):
                raise ValueError(f"initial_peers: {text!r} lacks the /p2p/PEERID part; copy the full "
                                 f"multiaddr the first peer printed ({PEER_MADDR_FORM})")
        for text in self.announce_maddrs:
            if _tcp_port(Multiaddr(text)) == 0:
                raise ValueError(f"announce_maddrs: {text!r} has port 0; announce an explicit port")
        if self.new_swarm and self.initial_peers:
            raise ValueError("initial_peers: must be empty with new_swarm=True; pass --new_swarm to start "
                             "a new network, or --initial_peers to join one")
        if not self.new_swarm and not self.initial_peers:
            raise ValueError("initial_peers: empty; pass --new_swarm to start a new network, "
                             "or --initial_peers to join one")
        for name in ("bootstrap_timeout_s", "request_timeout_s", "max_value_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"{name}: must be a positive finite number, got {value!r}")


class DhtMembership:
    """A hivemind DHT node in the current event loop, seen as keys of subkey -> bytes records."""

    def __init__(self, *, config: DhtConfig, p2p: P2P, node: DHTNode, visible_maddrs: list[str]) -> None:
        self._config = config
        self._p2p = p2p
        self._node = node
        self._visible_maddrs = visible_maddrs
        self._close_task: asyncio.Task[None] | None = None

    @classmethod
    async def create(cls, config: DhtConfig, *, hivemind_log_level: int = logging.ERROR) -> DhtMembership:
        """Start p2pd and a DHT node, join ``initial_peers`` (or start a new swarm)."""
        logging.getLogger("hivemind").setLevel(hivemind_log_level)
        _check_ports_free(config.host_maddrs)
        p2p = await _start_p2p(config)
        try:
            node = await _start_node(config, p2p)
            maddrs = [str(maddr) for maddr in await p2p.get_visible_maddrs()]
        except BaseException:
            await _stop_p2p(p2p)
            raise
        return cls(config=config, p2p=p2p, node=node, visible_maddrs=maddrs)

    def visible_maddrs(self) -> list[str]:
        """Full multiaddrs (with ``/p2p/<id>``) that others pass as ``--initial_peers``."""
        return list(self._visible_maddrs)

    def now(self) -> float:
        """DHT time (hivemind's ``get_dht_time``): the clock all expiration times are on."""
        return get_dht_time()

    async def store(self, key: str, subkey: str, value: bytes, *, expiration_time: float) -> bool:
        """Store ``value`` under ``key``/``subkey`` until ``expiration_time`` (DHT time).

        Returns False when no DHT node accepted it: already expired, or that subkey holds a value
        with a later expiration.
        """
        if not isinstance(value, bytes) or not value:
            raise ValueError("value: must be non-empty bytes (b'' is the withdrawal tombstone)")
        if len(value) > self._config.max_value_bytes:
            raise ValueError(f"value: {len(value)} bytes is over max_value_bytes={self._config.max_value_bytes}")
        return await self._store(key, subkey, value, expiration_time)

    async def withdraw(self, key: str, subkey: str, *, expiration_time: float) -> bool:
        """Hide ``key``/``subkey`` from everyone by storing an empty tombstone.

        ``expiration_time`` must be LATER than the withdrawn record's expiration, or the DHT keeps
        the record (hivemind keeps the latest-expiring value per subkey); returns False then.
        """
        return await self._store(key, subkey, b"", expiration_time)

    async def get_all(self, key: str) -> dict[str, tuple[bytes, float]]:
        """Every live record under ``key``: subkey -> (value, expiration time)."""
        records, _withdrawn = await self.get_entries(key)
        return records

    async def get_entries(self, key: str) -> tuple[dict[str, tuple[bytes, float]], set[str]]:
        """``get_all``'s records, and the subkeys found withdrawn (an unexpired tombstone).

        A read can come back partial (a DHT node that stopped answering held some subkeys), so a
        subkey missing from the records is not proof that it is gone; a withdrawn one is.
        """
        dht_key = _dht_key(key)
        found = await self._call("get", lambda: self._node.get(dht_key, latest=True))
        now = self.now()
        records = _live_records(found, now=now, max_value_bytes=self._config.max_value_bytes)
        return records, _withdrawn_subkeys(found, now=now)

    async def aclose(self) -> None:
        """Shut the DHT node down and make sure p2pd has exited. Safe to call more than once."""
        if self._close_task is None:
            self._close_task = asyncio.create_task(self._shutdown())
        await asyncio.shield(self._close_task)

    async def _shutdown(self) -> None:
        try:
            await _stop_node(self._node)
        finally:
            await _stop_p2p(self._p2p)

    async def _store(self, key: str, subkey: str, value: bytes, expiration_time: float) -> bool:
        if not isinstance(subkey, str) or not subkey:
            raise ValueError(f"subkey: must be a non-empty str, got {subkey!r}")
        if not isinstance(expiration_time, int | float) or not math.isfinite(expiration_time):
            raise ValueError(f"expiration_time: must be a finite DHT time, got {expiration_time!r}")
        dht_key = _dht_key(key)
        return bool(await self._call(
            "store", lambda: self._node.store(dht_key, value, float(expiration_time), subkey=subkey)))

    async def _call(self, what: str, request: Callable[[], Awaitable[_T]]) -> _T:
        if self._close_task is not None:
            raise TransportError(f"DHT {what}: this DhtMembership is closed")
        timeout_s = self._config.request_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                return await request()
        except TimeoutError as exc:
            raise TransportTimeout(f"DHT {what} took longer than request_timeout_s={timeout_s}") from exc
        except (ValueError, msgpack.UnpackException) as exc:
            raise DecodeError(f"DHT {what}: a value from the DHT does not decode: {exc}") from exc
        except _HIVEMIND_ERRORS as exc:
            raise TransportError(f"DHT {what} failed: {exc!r}") from exc


def _dht_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"key: must be a non-empty str, got {key!r}")
    return KEY_PREFIX + key


def _live_records(found: Any, *, now: float, max_value_bytes: int) -> dict[str, tuple[bytes, float]]:
    """Keep str subkeys holding non-empty bytes within the cap that have not expired."""
    if not isinstance(found, ValueWithExpiration) or not isinstance(found.value, dict):
        return {}
    records = {}
    for subkey, item in found.value.items():
        if not isinstance(subkey, str) or not isinstance(item, ValueWithExpiration):
            continue
        value, expiration = item.value, item.expiration_time
        if not isinstance(value, bytes) or not 0 < len(value) <= max_value_bytes:
            continue
        if isinstance(expiration, int | float) and expiration > now:
            records[subkey] = (value, float(expiration))
    return records


def _withdrawn_subkeys(found: Any, *, now: float) -> set[str]:
    """The str subkeys holding an unexpired tombstone (``b""``)."""
    if not isinstance(found, ValueWithExpiration) or not isinstance(found.value, dict):
        return set()
    return {subkey for subkey, item in found.value.items()
            if isinstance(subkey, str) and isinstance(item, ValueWithExpiration) and item.value == b""
            and isinstance(item.expiration_time, int | float) and item.expiration_time > now}


def _check_maddrs(field: str, values: tuple[str, ...], form: str) -> None:
    if not isinstance(values, tuple):
        raise ValueError(f"{field}: must be a tuple of multiaddr strings, got {type(values).__name__}")
    for text in values:
        try:
            maddr = Multiaddr(text)
            if "p2p" in maddr:
                PeerID.from_base58(maddr["p2p"])
        except (MultiaddrError, TypeError, ValueError) as exc:
            raise ValueError(f"{field}: {text!r} is not a valid multiaddr; expected {form}") from exc


def _tcp_port(maddr: Multiaddr) -> int | None:
    return int(maddr["tcp"]) if "tcp" in maddr else None


def _check_ports_free(host_maddrs: tuple[str, ...]) -> None:
    """Fail early on a busy port: p2pd listens with SO_REUSEPORT and would share it silently."""
    for text in host_maddrs:
        maddr = Multiaddr(text)
        family = socket.AF_INET if "ip4" in maddr else socket.AF_INET6 if "ip6" in maddr else None
        port = _tcp_port(maddr)
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
    with the instance in hand, ``_start_p2p`` can.
    """

    class _TrackedP2P(P2P):
        def __init__(self) -> None:
            super().__init__()
            started.append(self)

    return _TrackedP2P


async def _start_p2p(config: DhtConfig) -> P2P:
    """Start hivemind's p2pd; it connects to ``initial_peers`` before reporting ready."""
    started: list[P2P] = []
    try:
        return await _start_tracked_p2p(config, _tracking_p2p_class(started))
    except BaseException:
        for p2p in started:
            await _stop_p2p(p2p)
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


async def _start_node(config: DhtConfig, p2p: P2P) -> DHTNode:
    """Run a DHTNode on ``p2p``; raise BootstrapFailed if no initial peer answers a DHT ping."""
    try:
        async with asyncio.timeout(config.bootstrap_timeout_s + config.request_timeout_s):
            node = await DHTNode.create(
                p2p=p2p, initial_peers=list(config.initial_peers), client_mode=config.client_mode,
                wait_timeout=config.request_timeout_s / 3, bootstrap_timeout=config.bootstrap_timeout_s,
                ensure_bootstrap_success=False)
    except TimeoutError as exc:
        if config.initial_peers:
            raise _bootstrap_failed(config, "the DHT bootstrap timed out") from exc
        raise DhtStartFailed("the DHT node did not start within bootstrap_timeout_s") from exc
    except _HIVEMIND_ERRORS as exc:
        raise DhtStartFailed(f"the DHT node did not start: {exc!r}") from exc
    if config.initial_peers and not await _reaches_initial_peer(node, config):
        await _stop_node(node)
        raise _bootstrap_failed(config, "no initial peer answered a DHT ping")
    return node


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


async def _stop_node(node: DHTNode) -> None:
    """Remove the node's handlers from p2pd; failures are logged, as p2pd is stopped next anyway."""
    try:
        async with asyncio.timeout(_SHUTDOWN_TIMEOUT_S):
            await node.shutdown()
    except (TimeoutError, *_HIVEMIND_ERRORS) as exc:
        logger.debug("DHT node shutdown failed (p2pd is stopped next anyway): %r", exc)


async def _stop_p2p(p2p: P2P) -> None:
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
