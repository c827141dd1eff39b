"""A relayed data plane for peers that take no inbound connection (TURN-style allocations).

- ``wire``    one-line JSON control messages, the byte splice (``Pipe``), and ``Pace`` (a shared
              token bucket).
- ``splice``  ``Splice``: a paired ``Pipe``'s bytes moved in the kernel (Linux ``os.splice``
              through kernel pipes), never through Python; same pace, flow control, half-close.
- ``server``  ``RelayServer`` / ``RelayConfig`` / ``RelayRefused``: a public peer listens on
              fresh ports for each private peer it relays and splices every connection arriving
              there onto a connection the private peer opens outward.
- ``client``  ``RelayClient``: the private peer's end; keeps the control connection, attaches and
              forwards each announced connection to its own HTTP / TCP server.

A relay moves bytes and never reads them: what it carries is HTTP and gossamer TCP frames whose
signatures (and secure links' encryption) are end to end, so it can drop but never forge.
"""

from gossamer.transport.relay.client import RelayClient
from gossamer.transport.relay.server import RelayConfig, RelayRefused, RelayServer

__all__ = ["RelayClient", "RelayConfig", "RelayRefused", "RelayServer"]
