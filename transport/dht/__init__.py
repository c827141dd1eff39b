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

Modules: ``membership`` (``DhtMembership``), ``config`` (``DhtConfig`` and its address checks),
``startup`` (starting and stopping p2pd and the DHT node; ``DhtStartFailed``, ``BootstrapFailed``),
``records`` (reading records out of hivemind's answers). The public names are importable from
this package.
"""

from gossamer.transport.dht.config import PEER_MADDR_FORM, DhtConfig
from gossamer.transport.dht.membership import DhtMembership
from gossamer.transport.dht.records import KEY_PREFIX
from gossamer.transport.dht.startup import BootstrapFailed, DhtStartFailed

__all__ = ["KEY_PREFIX", "PEER_MADDR_FORM", "BootstrapFailed", "DhtConfig", "DhtMembership", "DhtStartFailed"]
