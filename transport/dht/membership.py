"""``DhtMembership``: one daemon's hivemind DHT node, seen as keys of signed subkey -> bytes records."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import msgpack
from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.p2p import P2P
from hivemind.utils.timed_storage import get_dht_time

from gossamer.crypto.identity import Identity
from gossamer.transport.dht.config import DhtConfig
from gossamer.transport.dht.entries import seal_entry
from gossamer.transport.dht.records import dht_key, read_entries
from gossamer.transport.dht.rejoin import Rejoiner
from gossamer.transport.dht.startup import (
    HIVEMIND_ERRORS,
    check_ports_free,
    start_node,
    start_p2p,
    stop_node,
    stop_p2p,
)
from gossamer.transport.dht.storage import BoundedStorage
from gossamer.transport.dht.validation import EntryValidator, KeyRule
from gossamer.transport.errors import DecodeError, TransportError, TransportTimeout

_T = TypeVar("_T")


class DhtMembership:
    """A hivemind DHT node in the current event loop, seen as keys of signed subkey -> bytes records."""

    def __init__(self, *, config: DhtConfig, p2p: P2P, node: DHTNode, validator: EntryValidator,
                 storage: BoundedStorage, visible_maddrs: list[str]) -> None:
        self._config = config
        self._rejoiner = Rejoiner(config.initial_peers, retry_s=config.request_timeout_s,
                                  timeout_s=config.request_timeout_s)
        self._p2p = p2p
        self._node = node
        self._validator = validator
        self._storage = storage
        self._visible_maddrs = visible_maddrs
        self._close_task: asyncio.Task[None] | None = None

    @classmethod
    async def create(cls, config: DhtConfig, *, rules: Sequence[KeyRule] = (),
                     hivemind_log_level: int = logging.ERROR) -> DhtMembership:
        """Start p2pd and a DHT node, join ``initial_peers`` (or start a new swarm). The node stores
        and believes only signed entries that pass ``rules`` as well (see ``validation``), and stores
        for others within ``config.storage`` (see ``storage``)."""
        logging.getLogger("hivemind").setLevel(hivemind_log_level)
        check_ports_free(config.host_maddrs)
        validator = EntryValidator(max_payload_bytes=config.max_value_bytes, max_lifetime_s=config.max_lifetime_s,
                                   max_clock_skew_s=config.max_clock_skew_s, rules=rules, now=get_dht_time)
        storage = BoundedStorage(config.storage, place=validator.place, now=get_dht_time)
        p2p = await start_p2p(config)
        try:
            node = await start_node(config, p2p, validator, storage)
            maddrs = [str(maddr) for maddr in await p2p.get_visible_maddrs()]
        except BaseException:
            await stop_p2p(p2p)
            raise
        return cls(config=config, p2p=p2p, node=node, validator=validator, storage=storage, visible_maddrs=maddrs)

    def visible_maddrs(self) -> list[str]:
        """Full multiaddrs (with ``/p2p/<id>``) that others pass as ``--initial_peers``."""
        return list(self._visible_maddrs)

    def now(self) -> float:
        """DHT time (hivemind's ``get_dht_time``): the clock all expiration times are on."""
        return get_dht_time()

    @property
    def rejoined(self) -> int:
        """How many times this node lost every DHT peer and joined again (``rejoin``)."""
        return self._rejoiner.rejoined

    @property
    def refused(self) -> Counter[str]:
        """DHT records this node refused to store or believe, by reason: the validator's (see
        ``EntryRefused``), the key rules' and the storage's quotas (``quota-signer``, ``quota-key``,
        ``quota-strangers``, ``budget``, ``tombstone``; see ``storage``)."""
        return self._validator.refused + self._storage.refused

    @property
    def evicted(self) -> Counter[str]:
        """Entries this node stored for others and dropped before they expired, by reason (``budget``:
        a stranger's entry made room for one of a run this node is part of)."""
        return Counter(self._storage.evicted)

    def storage_usage(self) -> dict[str, int]:
        """What this node stores for others: ``bytes`` (of them ``stranger_bytes``), ``entries``,
        ``keys``, and its ``budget_bytes``."""
        return self._storage.usage()

    async def store(self, key: str, value: bytes, *, signer: Identity, expiration_time: float) -> bool:
        """Sign ``value`` and store it under ``key``, subkey ``signer.peer_id``, until ``expiration_time``.

        Returns False when the DHT refused it: already expired, or the nodes hold an entry of that
        subkey with a later expiration; raises TransportError when no node answered (``_store``).
        """
        if not isinstance(value, bytes) or not value:
            raise ValueError("value: must be non-empty bytes (an empty payload is the withdrawal tombstone)")
        if len(value) > self._config.max_value_bytes:
            raise ValueError(f"value: {len(value)} bytes is over max_value_bytes={self._config.max_value_bytes}")
        return await self._store(key, value, signer, expiration_time)

    async def withdraw(self, key: str, *, signer: Identity, expiration_time: float) -> bool:
        """Hide ``signer``'s subkey of ``key`` from everyone with a signed, empty tombstone.

        ``expiration_time`` must be LATER than the withdrawn entry's expiration, or the DHT keeps
        the entry (hivemind keeps the latest-expiring value per subkey); returns False then.
        """
        return await self._store(key, b"", signer, expiration_time)

    async def get_all(self, key: str) -> dict[str, tuple[bytes, float]]:
        """Every live entry under ``key``: subkey (its writer's peer id) -> (value, expiration time)."""
        records, _withdrawn = await self.get_entries(key)
        return records

    async def get_entries(self, key: str) -> tuple[dict[str, tuple[bytes, float]], set[str]]:
        """``get_all``'s records, and the subkeys their writers withdrew (an unexpired tombstone).

        A read can come back partial (a DHT node that stopped answering held some subkeys), so a
        subkey missing from the records is not proof that it is gone; a withdrawn one is.
        """
        full_key = dht_key(key)
        found = await self._call("get", lambda: self._node.get(full_key, latest=True))
        return read_entries(found, key_id=DHTID.generate(source=full_key).to_bytes(), validator=self._validator,
                            now=self.now())

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

    async def _store(self, key: str, value: bytes, signer: Identity, expiration_time: float) -> bool:
        """Store a signed entry; True if readers will find it, False if the DHT holds another
        entry of this subkey that readers find instead; TransportError if nobody answered.

        hivemind reports, per store, the answer of whichever replica answered LAST (and no answer
        as a refusal), so one node that refuses (a node without gossamer's validator holding a
        value it should not) makes a store that every honest node took look failed. On a reported
        failure the key is read back (through the validator) to tell which it was.
        """
        if not isinstance(expiration_time, int | float) or not math.isfinite(expiration_time):
            raise ValueError(f"expiration_time: must be a finite DHT time, got {expiration_time!r}")
        now = self.now()
        if expiration_time <= now:
            return False  # every node refuses an expired value
        if expiration_time - now > self._config.max_lifetime_s:
            raise ValueError(f"expiration_time: {expiration_time - now:.0f} s from now is over "
                             f"max_lifetime_s={self._config.max_lifetime_s:.0f}")
        full_key, subkey = dht_key(key), signer.peer_id
        entry = seal_entry(signer, key=full_key, payload=value, signed_at=now, expires_at=float(expiration_time))
        if await self._call("store", lambda: self._node.store(full_key, entry, float(expiration_time), subkey=subkey)):
            return True
        records, withdrawn = await self.get_entries(key)
        if subkey in withdrawn:
            return not value
        if subkey not in records:
            raise TransportError(f"DHT store under {key}: no node confirmed it and reading it back found nothing "
                                 f"(nodes did not answer in time?)")
        return records[subkey] == (value, float(expiration_time))

    async def _call(self, what: str, request: Callable[[], Awaitable[_T]]) -> _T:
        if self._close_task is not None:
            raise TransportError(f"DHT {what}: this DhtMembership is closed")
        timeout_s = self._config.request_timeout_s
        try:
            await self._rejoiner.ensure_joined(self._node, self._p2p)  # bounded on its own
            async with asyncio.timeout(timeout_s):
                return await request()
        except TimeoutError as exc:
            raise TransportTimeout(f"DHT {what} took longer than request_timeout_s={timeout_s}") from exc
        except (ValueError, msgpack.UnpackException) as exc:
            raise DecodeError(f"DHT {what}: a value from the DHT does not decode: {exc}") from exc
        except HIVEMIND_ERRORS as exc:
            raise TransportError(f"DHT {what} failed: {exc!r}") from exc
