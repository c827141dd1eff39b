"""``DhtMembership``: one daemon's hivemind DHT node, seen as keys of subkey -> bytes records."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgpack
from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P
from hivemind.utils.timed_storage import get_dht_time

from gossamer.transport.dht.config import DhtConfig
from gossamer.transport.dht.records import dht_key, live_records, withdrawn_subkeys
from gossamer.transport.dht.startup import (
    HIVEMIND_ERRORS,
    check_ports_free,
    start_node,
    start_p2p,
    stop_node,
    stop_p2p,
)
from gossamer.transport.errors import DecodeError, TransportError, TransportTimeout

_T = TypeVar("_T")


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
        check_ports_free(config.host_maddrs)
        p2p = await start_p2p(config)
        try:
            node = await start_node(config, p2p)
            maddrs = [str(maddr) for maddr in await p2p.get_visible_maddrs()]
        except BaseException:
            await stop_p2p(p2p)
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
        full_key = dht_key(key)
        found = await self._call("get", lambda: self._node.get(full_key, latest=True))
        now = self.now()
        records = live_records(found, now=now, max_value_bytes=self._config.max_value_bytes)
        return records, withdrawn_subkeys(found, now=now)

    async def aclose(self) -> None:
        """Shut the DHT node down and make sure p2pd has exited. Safe to call more than once."""
        if self._close_task is None:
            self._close_task = asyncio.create_task(self._shutdown())
        await asyncio.shield(self._close_task)

    async def _shutdown(self) -> None:
        try:
            await stop_node(self._node)
        finally:
            await stop_p2p(self._p2p)

    async def _store(self, key: str, subkey: str, value: bytes, expiration_time: float) -> bool:
        if not isinstance(subkey, str) or not subkey:
            raise ValueError(f"subkey: must be a non-empty str, got {subkey!r}")
        if not isinstance(expiration_time, int | float) or not math.isfinite(expiration_time):
            raise ValueError(f"expiration_time: must be a finite DHT time, got {expiration_time!r}")
        full_key = dht_key(key)
        return bool(await self._call(
            "store", lambda: self._node.store(full_key, value, float(expiration_time), subkey=subkey)))

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
        except HIVEMIND_ERRORS as exc:
            raise TransportError(f"DHT {what} failed: {exc!r}") from exc
