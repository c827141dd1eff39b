"""Control-plane membership over a hivemind DHT: opaque byte records under ``gossamer/`` keys.

One ``DhtMembership`` per daemon runs a hivemind ``DHTNode`` inside the caller's asyncio loop; the
only other process is hivemind's ``p2pd`` child, which ``aclose()`` stops and checks is gone.
This module knows keys, subkeys, bytes and expirations; what a record means (signed peer record,
manifest) is decided above it. Callers pass keys such as ``run/demo@ab12cd34/peers``; they are
stored as ``gossamer/run/demo@ab12cd34/peers``.

Semantics worth knowing (hivemind 1.1.12):

- The DHT is shared with strangers, so every value is a signed entry (``entries``): its writer
  signs the payload together with the key and an expiration, and stores it under the subkey that
  is the writer's peer id. Every node runs ``EntryValidator`` (``validation``), so honest nodes
  neither store nor believe a plain value over a whole key, a value under someone else's subkey,
  a value replayed with a later expiration than its writer signed, or one that lives longer than
  ``max_lifetime_s``; the layer above adds ``KeyRule``s (which keys exist, whose subkeys each
  accepts). Refusals are counted by reason (``DhtMembership.refused``).
- A key holds a dictionary: one subkey per writer, each with its own expiration. For each subkey
  the DHT keeps the value with the LATEST expiration time; a store with an earlier (or already
  passed) expiration is rejected (``store`` returns False, which the caller must treat as a
  failure, not ignore).
- hivemind cannot delete. ``withdraw`` therefore stores a signed empty tombstone, which replaces
  the old value only if the tombstone's expiration is LATER than the record's (use the record's
  expiration plus a margin); only the subkey's own key can sign it. ``get_all`` hides
  tombstones; after the tombstone expires the subkey is gone entirely.
- Expirations are DHT time: use ``now()`` (hivemind's ``get_dht_time``) to compute them.

Errors: bad config raises ``ValueError`` naming the field; a failed start raises
``DhtStartFailed`` or ``BootstrapFailed``; a request raises ``TransportTimeout`` past its
deadline, ``DecodeError`` for a value hivemind cannot decode, ``TransportError`` otherwise.
``EntryRefused`` (a ``DecodeError``) is what a key rule raises; the validator turns it into a
refusal.

Modules: ``membership`` (``DhtMembership``), ``config`` (``DhtConfig`` and its address checks),
``startup`` (starting and stopping p2pd and the DHT node; ``DhtStartFailed``, ``BootstrapFailed``),
``entries`` (signed entries: ``seal_entry``, ``open_entry``, ``Entry``, ``EntryRefused``),
``validation`` (``EntryValidator``, ``KeyRule``), ``records`` (reading entries out of hivemind's
answers), ``rejoin`` (``Rejoiner``: a node that lost every peer, e.g. after its host stalled,
bootstraps again before its next request). The public names are importable from this package.
"""

from gossamer.transport.dht.config import PEER_MADDR_FORM, DhtConfig
from gossamer.transport.dht.entries import Entry, EntryRefused
from gossamer.transport.dht.membership import DhtMembership
from gossamer.transport.dht.records import KEY_PREFIX
from gossamer.transport.dht.startup import BootstrapFailed, DhtStartFailed
from gossamer.transport.dht.validation import KeyRule

__all__ = ["KEY_PREFIX", "PEER_MADDR_FORM", "BootstrapFailed", "DhtConfig", "DhtMembership", "DhtStartFailed",
           "Entry", "EntryRefused", "KeyRule"]
