"""A relayed data plane for peers that take no inbound connection (TURN-style allocations). A relay
moves bytes and never reads them: signatures and encryption are end to end, so it can drop but
never forge (README.md, "Relay").

- ``wire``    one-line JSON control messages, the byte splice (``Pipe``), ``Pace`` (a token bucket).
- ``splice``  ``Splice``: a paired ``Pipe``'s bytes moved in the kernel (Linux ``os.splice``).
- ``config``  ``RelayConfig`` / ``RelayRefused``: the caps a relay keeps, and its refusal.
- ``caps``    ``Unproven`` / ``Deadlines``: what strangers may hold, and for how long (no I/O).
- ``listen``  ``Listener``: the accept loop; out of descriptors it pauses and logs, throttled.
- ``server``  ``RelayServer``: the public peer's end.
- ``client``  ``RelayClient``: the private peer's end."""

from gossamer.transport.relay.client import RelayClient
from gossamer.transport.relay.config import RelayConfig, RelayRefused
from gossamer.transport.relay.server import RelayServer

__all__ = ["RelayClient", "RelayConfig", "RelayRefused", "RelayServer"]
