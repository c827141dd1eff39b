"""A relayed data plane for peers that take no inbound connection (TURN-style allocations). A relay
moves bytes and never reads them: signatures and encryption are end to end, so it can drop but
never forge (README.md, "Relay").

- ``wire``    one-line JSON control messages, the byte splice (``Pipe``), ``Pace`` (a token bucket).
- ``splice``  ``Splice``: a paired ``Pipe``'s bytes moved in the kernel (Linux ``os.splice``).
- ``server``  ``RelayServer`` / ``RelayConfig`` / ``RelayRefused``: the public peer's end.
- ``client``  ``RelayClient``: the private peer's end."""

from gossamer.transport.relay.client import RelayClient
from gossamer.transport.relay.server import RelayConfig, RelayRefused, RelayServer

__all__ = ["RelayClient", "RelayConfig", "RelayRefused", "RelayServer"]
