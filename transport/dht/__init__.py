"""Control-plane membership over a hivemind DHT: signed byte records under ``gossamer/`` keys, one
subkey per writer, validated by every node (README.md, "DHT membership", has the semantics).

- ``membership``  ``DhtMembership``: one daemon's DHT node; store, get, withdraw, ``now()``.
- ``config``      ``DhtConfig`` and its address checks.
- ``startup``     starting and stopping p2pd and the DHT node (``DhtStartFailed``, ``BootstrapFailed``).
- ``entries``     signed entries: ``seal_entry``, ``open_entry``, ``Entry``, ``EntryRefused``.
- ``validation``  ``EntryValidator`` and ``KeyRule``: what every node stores and believes.
- ``records``     reading entries out of hivemind's answers.
- ``storage``     ``BoundedStorage`` and ``StorageLimits``: what a node keeps for others, within quotas.
- ``rejoin``      ``Rejoiner``: a node that lost every peer bootstraps again before its next request.

The public names are importable from this package."""

from gossamer.transport.dht.config import PEER_MADDR_FORM, DhtConfig
from gossamer.transport.dht.entries import Entry, EntryRefused
from gossamer.transport.dht.membership import DhtMembership
from gossamer.transport.dht.records import KEY_PREFIX
from gossamer.transport.dht.startup import BootstrapFailed, DhtStartFailed
from gossamer.transport.dht.storage import StorageLimits
from gossamer.transport.dht.validation import KeyRule

__all__ = ["KEY_PREFIX", "PEER_MADDR_FORM", "BootstrapFailed", "DhtConfig", "DhtMembership", "DhtStartFailed",
           "Entry", "EntryRefused", "KeyRule", "StorageLimits"]
